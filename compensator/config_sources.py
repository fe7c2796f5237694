"""Where each setting's value came from, and every problem with the values as they were given.

msgspec stops at a document's first type error and says where only as `$.api.port`; people fixing
a configuration want every problem at once, each naming the file or the environment variable it
came from and the field. So the environment is read one variable per field, each value is
converted on its own, unknown sections and settings are named, and the model's checks
(compensator/config.py, which owns the model) get the origin of the field they name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

Origins = dict[tuple[str, str], str]
"""(section, field) -> the file or the variable its value came from."""


def _fields(model: type[msgspec.Struct]) -> dict[str, Any]:
    return {field.name: field.type for field in msgspec.structs.fields(model)}


def _env_value(text: str, field_type: Any) -> Any:
    """An environment string as the field's type: JSON when it parses, else the string itself,
    and a comma-separated list for a tuple field."""
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    if getattr(field_type, "__origin__", None) is tuple and isinstance(value, str):
        value = [item.strip() for item in value.split(",") if item.strip()]
    return value


def env_overrides(
    environ: Mapping[str, str], model: type[msgspec.Struct], prefix: str
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """`prefix` + SECTION__FIELD variables as values of the model's fields, and one problem per
    variable that names no field."""
    sections = _fields(model)
    found: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name in sorted(environ):
        if not name.startswith(prefix) or "__" not in name:
            continue
        section, _, field = name[len(prefix) :].lower().partition("__")
        section_type = sections.get(section)
        fields = {} if section_type is None else _fields(section_type)
        if field not in fields:
            problems.append(f"{name}: no such setting ({section}.{field})")
            continue
        found.setdefault(section, {})[field] = _env_value(environ[name], fields[field])
    return found, problems


def typed(
    document: dict[str, Any], origins: Origins, where: str, model: type[msgspec.Struct]
) -> tuple[dict[str, Any], list[str]]:
    """The document without the fields whose values do not have their type, and a problem for each
    of those and for each unknown section and field: msgspec stops at the first, people want all."""
    sections = _fields(model)
    checked: dict[str, Any] = {}
    problems: list[str] = []
    for section, fields in document.items():
        if section not in sections:
            problems.append(f"{where}: [{section}]: no such section (the sections: {', '.join(sections)})")
            continue
        if not isinstance(fields, dict):
            problems.append(f"{where}: {section}: must be a table ([{section}])")
            continue
        types = _fields(sections[section])
        kept: dict[str, Any] = {}
        for name, value in fields.items():
            origin = origins.get((section, name), where)
            if name not in types:
                problems.append(f"{origin}: {section}.{name}: no such setting")
                continue
            try:
                msgspec.convert(value, types[name], strict=False)
            except msgspec.ValidationError as error:
                problems.append(f"{origin}: {_readable(str(error), f'{section}.{name}')}")
                continue
            kept[name] = value
        checked[section] = kept
    return checked, problems


def located(problem: str, origins: Origins, where: str) -> str:
    """A check's `section.field: message` with where that value came from; a check of a whole
    section (`section: message`) names the file when the file set any of it, else the environment."""
    head = problem.split(":", 1)[0]
    section, _, name = head.partition(".")
    origin = origins.get((section, name.split(".")[0]))
    if origin is None:
        set_by = {found for (known, _), found in origins.items() if known == section}
        origin = where if where in set_by or not set_by else "environment"
    return f"{origin}: {problem}"


def _readable(message: str, field: str) -> str:
    """msgspec says ``... - at `$.port` ``; people read ``api.port: ...``."""
    text, sep, at = message.rpartition(" - at `$")
    if not sep:
        return f"{field}: {message}"
    return f"{field}{at.rstrip('`').replace('[', '.').replace(']', '')}: {text}"
