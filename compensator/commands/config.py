"""``compensator config``: check a configuration file, show the configuration in force, and write
the reference of every setting from the model itself.

    compensator config check FILE     one line per problem (exit 1), or "FILE: ok"
    compensator config show [--config FILE]   the configuration in force (file + environment), as TOML
    compensator config docs           the reference (docs/configuration.md is this output)

Why generated: a setting documented by hand drifts from the code that reads it. The reference is
built from the model's fields, types, defaults and the docstrings under each field (read from the
source, as documentation tools do), and a test fails when docs/configuration.md is not today's
output, so a new field without a line of documentation is visible in review.

Must never: print a secret. The configuration holds none (secrets are files it names), and the
reference shows defaults only.
"""

from __future__ import annotations

import argparse
import ast
import enum
import inspect
import json
import textwrap
import types
from pathlib import Path
from typing import Annotated, Any, Final, Union, get_args, get_origin

import msgspec

from compensator import config as configuration
from compensator.config_file import add_config_argument, load_for


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    command = subparsers.add_parser("config", help="check a configuration file, show the one in force, document it")
    actions = command.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate FILE (with this environment's overrides)")
    check.add_argument("file", type=Path)
    show = actions.add_parser("show", help="the configuration in force, as TOML")
    add_config_argument(show)
    actions.add_parser("docs", help="the reference of every setting, as Markdown")
    command.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "check":
        if not args.file.is_file():
            raise configuration.ConfigError([f"{args.file}: no such file"])
        configuration.load(args.file)  # raises ConfigError: one line per problem
        print(f"{args.file}: ok")
    elif args.action == "show":
        print(to_toml(msgspec.to_builtins(load_for(args))), end="")
    else:
        print(reference(), end="")
    return 0


# ---- TOML out (the subset the configuration needs: tables, scalars, lists, inline tables) --------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {_toml_value(item)}" for key, item in value.items() if item is not None) + " }"
    raise TypeError(f"no TOML for {type(value).__name__}")


def to_toml(document: dict[str, Any]) -> str:
    lines: list[str] = []
    for section, fields in document.items():
        lines.append(f"[{section}]")
        lines += [f"{name} = {_toml_value(value)}" for name, value in fields.items() if value is not None]  # unset: absent
        lines.append("")
    return "\n".join(lines)


# ---- the reference -------------------------------------------------------------------------------


def _field_docs(struct: type) -> dict[str, str]:
    """The string literal under each annotated field of `struct` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(struct.__mro__):
        if klass in (object, msgspec.Struct) or not klass.__module__.startswith(("compensator", "handlers", "outbox")):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
        for statement, following in zip(body, [*body[1:], None], strict=True):
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):  # fmt: skip
                docs[statement.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
    return docs


_BOUNDS: Final = (
    ("ge", "≥"),
    ("gt", ">"),
    ("le", "≤"),
    ("lt", "<"),
    ("min_length", "length ≥"),
    ("max_length", "length ≤"),
)


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *metadata = get_args(annotation)
        bounds = [f"{symbol} {getattr(meta, name)}" for meta in metadata for name, symbol in _BOUNDS
                  if isinstance(meta, msgspec.Meta) and getattr(meta, name) is not None]  # fmt: skip
        return _type_name(inner) + (f" ({', '.join(bounds)})" if bounds else "")
    if origin is tuple:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if origin is not None and str(origin) == "typing.Literal":
        return " \\| ".join(json.dumps(arg) for arg in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(json.dumps(member.value) for member in annotation)
    if origin in (types.UnionType, Union) and type(None) in get_args(annotation):
        return " \\| ".join(_type_name(arg) for arg in get_args(annotation) if arg is not type(None)) + ", or unset"
    return getattr(annotation, "__name__", str(annotation)).replace("|", "\\|")


def _default(value: Any) -> str:
    if isinstance(value, msgspec.Struct):
        return "the rows below"
    if value is None:
        return "unset"
    return f"`{_toml_value(msgspec.to_builtins(value))}`"


def _rows(instance: msgspec.Struct, prefix: str, env: str, out: list[str], nested: list[tuple[msgspec.Struct, str]],
          documented: dict[type, tuple[str, msgspec.Struct]]) -> None:  # fmt: skip
    """One row per field of `instance` (the default value of its section or table); a table of a
    type already documented points to it instead of repeating its rows."""
    docs = _field_docs(type(instance))
    for field in msgspec.structs.fields(type(instance)):
        name = f"{prefix}.{field.name}"
        default = getattr(instance, field.name)
        variable = f"`{env}__{field.name.upper()}`" if env else f"in `{nested_env(prefix)}` (JSON)"
        shown = _default(default)
        if isinstance(default, msgspec.Struct):
            if type(default) in documented:
                first_name, first = documented[type(default)]
                differs = {key: value for key, value in msgspec.to_builtins(default).items()
                           if msgspec.to_builtins(first).get(key) != value}  # fmt: skip
                shown = f"fields as `{first_name}`" + (f", but `{_toml_value(differs)}`" if differs else "")
            else:
                documented[type(default)] = (name, default)
                nested.append((default, name))
        out.append(f"| `{name}` | {_type_name(field.type)} | {shown} | {variable} | {docs.get(field.name, '')} |")


def nested_env(prefix: str) -> str:
    section, _, field = prefix.partition(".")
    return f"{configuration.ENV_PREFIX}{section.upper()}__{field.split('.')[0].upper()}"


def reference() -> str:
    module_doc = inspect.cleandoc(configuration.__doc__ or "")
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `compensator config docs` from compensator/config.py; a test keeps it current. -->",
        "",
        module_doc.split("\n\nOwns:")[0],
        "",
        "Check a file with `compensator config check FILE`; see what is in force with `compensator config show`.",
        "",
    ]
    for section in msgspec.structs.fields(configuration.Config):
        struct = section.type
        lines += [f"## `[{section.name}]`", ""]
        section_doc = _field_docs(configuration.Config).get(section.name) or inspect.cleandoc(struct.__doc__ or "")
        if section_doc and "Struct" not in section_doc.split()[0]:
            lines += [" ".join(section_doc.split()), ""]
        lines += ["| setting | type | default | environment | meaning |", "|---|---|---|---|---|"]
        nested: list[tuple[msgspec.Struct, str]] = []
        documented: dict[type, tuple[str, msgspec.Struct]] = {}
        defaults = getattr(configuration.Config(), section.name)
        _rows(defaults, section.name, f"{configuration.ENV_PREFIX}{section.name.upper()}", lines, nested, documented)
        while nested:
            inner, prefix = nested.pop(0)
            _rows(inner, prefix, "", lines, nested, documented)
        lines.append("")
    lines += ["## Other environment variables", "", "| variable | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {text} |" for name, text in configuration.OTHER_VARIABLES.items()]
    lines.append("")
    return "\n".join(lines)
