"""ISO 4217: the active currency codes and the number of digits of their minor unit.

Amounts travel as integers in minor units everywhere (cents, fen, yen): this table is what turns
``12345 JPY`` into ``¥12,345`` and ``12345 USD`` into ``$123.45`` for a person, and what refuses a
currency nobody can settle in. Funds codes (BOV, CHE, ...) are included; precious metals, testing
codes and XXX are not: nothing is paid in them.

Must never: do I/O or read a locale (formatting for people is the review page's job).
"""

from __future__ import annotations

from typing import Final

_EXPONENT_0: Final = "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF"
_EXPONENT_3: Final = "BHD IQD JOD KWD LYD OMR TND"
_EXPONENT_4: Final = "CLF UYW"
_EXPONENT_2: Final = (
    "AED AFN ALL AMD AOA ARS AUD AWG AZN BAM BBD BDT BGN BMD BND BOB BOV BRL BSD BTN BWP BYN BZD CAD CDF"
    " CHE CHF CHW CNY COP COU CRC CUP CVE CZK DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GTQ"
    " GYD HKD HNL HTG HUF IDR ILS INR IRR JMD KES KGS KHR KPW KYD KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD"
    " MMK MNT MOP MRU MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR RON"
    " RSD RUB SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TOP TRY TTD TWD TZS"
    " UAH USD USN UYU UZS VED VES WST XCD XCG YER ZAR ZMW ZWG"
)

MINOR_UNIT_DIGITS: Final[dict[str, int]] = {
    code: digits
    for digits, codes in ((0, _EXPONENT_0), (2, _EXPONENT_2), (3, _EXPONENT_3), (4, _EXPONENT_4))
    for code in codes.split()
}
"""Active ISO 4217 code -> digits after the decimal point of its minor unit."""


def is_currency(code: str) -> bool:
    return code in MINOR_UNIT_DIGITS


def major_units(amount_minor: int, currency: str) -> str:
    """``12345, "USD"`` -> ``"123.45"``: exact, no float ever touches the amount."""
    digits = MINOR_UNIT_DIGITS[currency]
    sign = "-" if amount_minor < 0 else ""
    whole, fraction = divmod(abs(amount_minor), 10**digits)
    return f"{sign}{whole}.{fraction:0{digits}d}" if digits else f"{sign}{whole}"
