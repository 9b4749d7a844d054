"""Per-language word tables used by the number rules (currency names, scale words, percent...)."""
from __future__ import annotations

# code -> (singular, plural, subunit singular, subunit plural); subunit None = no cents
_EN = {
    "USD": ("dollar", "dollars", "cent", "cents"),
    "EUR": ("euro", "euros", "cent", "cents"),
    "GBP": ("pound", "pounds", "penny", "pence"),
    "JPY": ("yen", "yen", None, None),
    "CHF": ("franc", "francs", "centime", "centimes"),
    "INR": ("rupee", "rupees", "paisa", "paise"),
}
_DE = {
    "USD": ("Dollar", "Dollar", "Cent", "Cent"),
    "EUR": ("Euro", "Euro", "Cent", "Cent"),
    "GBP": ("Pfund", "Pfund", "Penny", "Pence"),
    "JPY": ("Yen", "Yen", None, None),
    "CHF": ("Franken", "Franken", "Rappen", "Rappen"),
    "INR": ("Rupie", "Rupien", "Paisa", "Paise"),
}
_SYMBOLS = {"$": "USD", "US$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY", "₹": "INR", "Fr.": "CHF"}


def _with_symbols(table: dict) -> dict:
    out = dict(table)
    for sym, code in _SYMBOLS.items():
        if code in table and sym != "Fr.":
            out[sym] = table[code]
    return out


CURRENCIES = {"en": _with_symbols(_EN), "de": _with_symbols(_DE)}
# German amounts written with the currency word ("1 Euro" -> "ein Euro")
CURRENCIES["de"].update({"Euro": _DE["EUR"], "Dollar": _DE["USD"], "Pfund": _DE["GBP"], "Franken": _DE["CHF"]})
SCALES = {
    "en": {"thousand": "thousand", "k": "thousand", "million": "million", "m": "million", "mn": "million",
           "billion": "billion", "bn": "billion", "b": "billion", "trillion": "trillion", "tn": "trillion"},
    "de": {"Tsd.": "Tausend", "Mio.": "Millionen", "Millionen": "Millionen", "Million": "Million",
           "Mrd.": "Milliarden", "Milliarden": "Milliarden", "Milliarde": "Milliarde", "Billionen": "Billionen"},
}
PERCENT = {"en": "percent", "de": "Prozent", "fr": "pour cent", "es": "por ciento", "it": "per cento",
           "pt": "por cento", "nl": "procent", "ru": "процентов", "pl": "procent", "sv": "procent", "da": "procent"}
MINUS = {"en": "minus", "de": "minus", "fr": "moins", "es": "menos", "it": "meno", "pt": "menos", "nl": "min",
         "ru": "минус", "pl": "minus"}
AND = {"en": "and", "de": "und"}
MONTHS_EN = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
             "October", "November", "December"]
MONTHS_DE = ["Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
             "November", "Dezember"]
MONTH_ABBR_DE = {"Jan.": 1, "Feb.": 2, "Mär.": 3, "Apr.": 4, "Jun.": 6, "Jul.": 7, "Aug.": 8, "Sep.": 9,
                 "Sept.": 9, "Okt.": 10, "Nov.": 11, "Dez.": 12}
UNITS = {
    "en": {"km": ("kilometer", "kilometers"), "kg": ("kilogram", "kilograms"), "cm": ("centimeter", "centimeters"),
           "mm": ("millimeter", "millimeters"), "mph": ("mile per hour", "miles per hour"),
           "km/h": ("kilometer per hour", "kilometers per hour"), "°C": ("degree Celsius", "degrees Celsius"),
           "°F": ("degree Fahrenheit", "degrees Fahrenheit"), "lbs": ("pound", "pounds"), "lb": ("pound", "pounds"),
           "ml": ("milliliter", "milliliters"), "GB": ("gigabyte", "gigabytes"), "MB": ("megabyte", "megabytes")},
    "de": {"km": ("Kilometer", "Kilometer"), "kg": ("Kilogramm", "Kilogramm"), "cm": ("Zentimeter", "Zentimeter"),
           "mm": ("Millimeter", "Millimeter"), "km/h": ("Kilometer pro Stunde", "Kilometer pro Stunde"),
           "°C": ("Grad Celsius", "Grad Celsius"), "ml": ("Milliliter", "Milliliter"), "g": ("Gramm", "Gramm"),
           "GB": ("Gigabyte", "Gigabyte"), "MB": ("Megabyte", "Megabyte")},
}


def one_before_noun(words: str, lang: str) -> str:
    """German "eins" becomes "ein" before a noun ("ein Euro")."""
    if lang == "de" and words.endswith("eins"):
        return words[:-1]
    return words
