"""The day a turn tells of, read from its words against the time it was said.

"Yesterday", "3 days ago", "in two days", "on 12 March", "last Saturday", "in September
2024", "on the 12th", "the weekend before last", "last spring", "since New Year's Eve", "at
Easter": :func:`resolve_date`
finds the time expressions of a text and resolves the *first* one said (the event a turn opens
with is the one it is about: "accepted yesterday!! i start sept 1" tells of yesterday). Named
months and years go to dateparser (English only); weekdays, days of the month, seasons and the
few fixed holidays people name are resolved here, because they need the sentence's tense:
"Planted the tomatoes on Sunday" is the Sunday gone, "She's 32 on Saturday" the one to come,
and dateparser reads "32 on Saturday" as a day of 1932.

A sentence tells of the past when it has a past-tense verb (:data:`_PAST_TENSE`), of the future
when it says so (:data:`_FUTURE`); only the sentence holding the expression is read ("next door"
in another sentence does not make "on Sunday" next Sunday). A day said with neither is the
nearer of its two occurrences. Nothing found: the day it was said.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from datetime import date, datetime, timedelta

from dateutil.easter import easter

from inferscale_core.time_query import (
    DAY_MONTH,
    SEASON,
    month_names_masked,
    month_number,
    season_interval,
)

_SENTENCE = re.compile(r"[^.!?;]+[.!?;]*")  # a sentence (or a part of one after ";")
_CLAUSE = re.compile(r"(?:\bthat\b)?(?:(?!\bthat\b)[^,.!?;:—–])+[,.!?;:—–]*")

_COUNT = (
    r"(\d{1,3}|a|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen"
    r"|fourteen|fifteen|eighteen|twenty|a\s+couple\s+of|a\s+few)"
)
_AGO = r"(?:ago|back)"  # "ten days back"
_DAYS_AGO = re.compile(rf"\b{_COUNT}\s+days?\s+{_AGO}\b", re.I)
_WEEKS_AGO = re.compile(rf"\b(?:{_COUNT}\s+weeks?|a\s+(fortnight))\s+{_AGO}\b(?!\s+\w+day\b)", re.I)
# "two years ago", "a couple of months ago", "18 months ago": the same day that many back
_MONTHS_AGO = re.compile(rf"\b{_COUNT}\s+(months?|years?)\s+{_AGO}\b", re.I)
# "in two days", "in a week", "in a fortnight": that many on, unless its clause tells of the
# past ("I read it in 3 days" is how long it took)
_IN_DAYS = re.compile(rf"\bin\s+(?:{_COUNT}\s+(days?|weeks?)|a\s+(fortnight))\b", re.I)
_NUMBER_WORDS = {
    "a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "eighteen": 18, "twenty": 20,
    "a couple of": 2, "a few": 3,
}  # fmt: skip
# (pattern, days from the day said) of the fixed relative words; months and years below
_SHIFTS = (
    # "the day before yesterday" starts before its "yesterday": the earlier expression wins
    (re.compile(r"\b(?:the\s+)?day\s+before\s+yesterday\b", re.I), -2),
    (re.compile(r"\b(?:the\s+)?day\s+after\s+(?:tomorrow|tmrw)\b", re.I), 2),
    (re.compile(r"\ba\s+week\s+(?:from\s+)?(?:tomorrow|tmrw)\b", re.I), 8),
    (re.compile(r"\ba\s+week\s+(?:from\s+)?today\b", re.I), 7),
    (re.compile(r"\b(?:yesterday|last\s+night|yday)\b", re.I), -1),
    # the day said, but said first: "Cremà tonight. ... went up last year" tells of tonight
    (re.compile(r"\b(?:tonight|today|this\s+(?:morning|afternoon|evening))\b", re.I), 0),
    (re.compile(r"\b(?:tomorrow|tmrw|tmr|2moro|tomoz)\b", re.I), 1),
    (re.compile(r"\blast\s+week\b", re.I), -7),
    (re.compile(r"\bthe\s+week\s+before\s+last\b", re.I), -14),
    (re.compile(r"\bnext\s+week\b", re.I), 7),
)
_DAY_NAME = r"(?P<day>mon|tues?|wed(?:nes)?|thur?s?|fri|sat(?:ur)?|sun)(?:day)?"
_FULL_DAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"  # a weekday's full name
_FULL_DAY_AS = r"(?P<{}>mon|tues|wednes|thurs|fri|satur|sun)day"  # ... its stem named
# "last week" and, later in its sentence or the next, a weekday alone ("on Wednesday"): the
# weekday's match (its groups as _WEEKDAY's), found from "last week" on
_LAST_WEEK_ON = re.compile(
    r"\b(?:last\s+week|(?P<before>the\s+week\s+before\s+last))\b[^.!?;]*?(?:[.!?;]+[^.!?;]*?)?"
    rf"\b(?:(?P<which>on)\s+)?{_DAY_NAME}\b",
    re.IGNORECASE,
)
_WEEK_AGO_WEEKDAY = re.compile(
    rf"\ba\s+week\s+ago\s+(?:last\s+)?{_FULL_DAY_AS.format('day')}\b", re.I
)
_LAST_MONTH = re.compile(r"\blast\s+month\b", re.I)
_LAST_YEAR = re.compile(r"\blast\s+year\b", re.I)

# Named dates. A text naming a month, an ISO date or a year ("in 2019") goes to dateparser
# (against the turn's own time); the cheap check (_DATE_WORD) keeps every other text away from
# it and is the guard on what it finds: a span it reads as a date ("900 a month", modal "may")
# counts only if it holds one of these words.
_MONTHS = (
    r"(?:january|february|march|april|june|july|august|september|october|november|december"
    r"|jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\b|(?-i:May)\b"
    # "may" in lower case is the month beside a day's number ("my last day is may 30")
    # (not the verb after its subject: "I may 2x it")
    r"|(?<!\bi\s)(?<!you\s)(?<!\bwe\s)(?<!they\s)(?<!\bhe\s)(?<!she\s)(?<!\bit\s)"
    r"may(?=\s+\d{1,2}(?:st|nd|rd|th)?\b)|(?<=\d\s)may\b|(?<=\d[a-z]{2}\s)may\b"
    r"|(?<=\d[a-z]{2}\sof\s)may\b"  # "the 8th of may"
)
# "on 14 feb last year", "March 3rd next year": the day of the year named
_DATE_OF_REL_YEAR = re.compile(
    rf"\b(?:(?P<d1>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<m1>{_MONTHS})"
    rf"|(?P<m2>{_MONTHS})\s+(?P<d2>\d{{1,2}})(?:st|nd|rd|th)?)"
    r",?\s+(?P<rel>last|this|next)\s+year\b",
    re.IGNORECASE,
)
_MONTH_STOP = re.compile(
    r"\b(jan|feb|mar|apr|jun|jul|aug|sept?|oct|nov|dec)\.(?=\s*\d)", re.IGNORECASE
)
_DATE_WORD = re.compile(
    rf"\b(?:{_MONTHS}|\d{{4}}-\d\d-\d\d\b|(?:in|since|during|of)\s+(?:19|20)\d\d\b)",
    re.IGNORECASE,
)
# "from 3 to 5 May", "12-16 April", "between 2 and 6 September": the first day, the same month.
_DAY_RANGE = re.compile(
    r"\b(\d{1,2})(?:st|nd|rd|th)?\s*(?:-|–|to|till|until|and)\s*\d{1,2}(?:st|nd|rd|th)?"
    rf"(?=\s+(?:{_MONTHS}))",
    re.IGNORECASE,
)
_WEEKDAYS = ("mon", "tues", "wednes", "thurs", "fri", "satur", "sun")
_WEEKDAY = re.compile(
    rf"\b(?:(?P<which>last|this|next|on|coming)\s+)?{_DAY_NAME}\b"
    # not a weekday of a date ("Tuesday 12 March", "Saturday the 7th": the date's); a time
    # after it ("this coming tuesday 10am") leaves it a weekday
    r"(?!\s*\d{1,2}(?!\s*(?:am|pm|a\.m|p\.m|[:.h]\d))(?:st|nd|rd|th)?\b|,?\s*the\s+\d|\s*(?:"
    + _MONTHS
    + "))",
    re.IGNORECASE,
)
# "Saturday the 7th", "on thursday, the 4th": the 7th that is a Saturday, near the day said
_WEEKDAY_DOM = re.compile(
    rf"\b(?:on\s+)?{_DAY_NAME},?\s+the\s+(?P<dom>\d{{1,2}})(?:st|nd|rd|th)\b", re.IGNORECASE
)
# "monday last week", "on the Tuesday of the week before last": that weekday of that week
_WEEKDAY_OF_WEEK = re.compile(
    rf"\b(?:on\s+)?(?:the\s+)?{_FULL_DAY_AS.format('day')}\s+(?:of\s+)?"
    r"(?:(?P<before>the\s+week\s+before\s+last)|last\s+week)\b"
    # "next week Monday" (Indian English): that weekday of next week
    rf"|\b(?P<next>next)\s+week\s+(?:on\s+)?{_FULL_DAY_AS.format('day2')}\b",
    re.IGNORECASE,
)
# A weekday that recurs ("thursday nights in the church hall", "every Friday") names no day;
# one a week on ("a week on Friday", "Friday week", "Thursday next week") is a week after the
# one to come.
_RECURRING = re.compile(r"\s+(?:nights|mornings|afternoons|evenings)\b", re.IGNORECASE)
_EVERY = re.compile(r"\bevery\s+$", re.IGNORECASE)
_WEEK_ON_BEFORE = re.compile(r"\ba\s+week\s+(?:on|from)?\s*$", re.IGNORECASE)
_WEEK_ON_AFTER = re.compile(r"\s+(?:next\s+)?week\b", re.IGNORECASE)
_BEFORE_LAST = re.compile(r"\s+before\s+last\b", re.IGNORECASE)  # "the Thursday before last"
# "on the 12th", "by the 3rd", "booked for the 21st": a day of the month said alone ("the 3rd
# of May" is dateparser's, "the 3rd of next month" _OF_MONTH's), not an ordinal of something
# else ("on the 3rd floor", "for the 2nd time")
_DAY_OF_MONTH = re.compile(
    r"(?:\b(?:on|by|for|from|since|until|till|before|after|starting|beginning|as\s+of"
    r"|(?:moved|pushed(?:\s+back)?|bumped|changed|brought\s+forward)\s+to)"
    r"\s+(?:the\s+)?|\b(?:is|was|are|were|'s)\s+the\s+|^the\s+)(\d{1,2})(?:st|nd|rd|th)\b"
    rf"(?!\s+(?:of\s+)?(?:{_MONTHS}|(?:this|next|last)\s+month))"
    r"(?!\s+(?:time|times|floor|place|row|round|go|try|attempt|lap|day|week|year|anniversary"
    r"|birthday|century|grade|edition|series|season|stop|hole|page|chapter|book)\b)",
    re.IGNORECASE,
)
# A day named within a month: "the first of next month", "the 15th of this month", "the last
# day of February", "the end of January" (its last day; "the middle of" the 15th, "the end of
# the month" this month's), "the last Friday of June", "the second Sunday in April" (a month
# without its year: the nearest by the sentence's tense, as a named date)
_ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "last": -1}
_OF_MONTH = re.compile(
    r"\b(?:the\s+(?:(?P<dom>\d{1,2})(?:st|nd|rd|th)|(?P<first>first)|(?P<lastday>last\s+day))"
    r"|(?:the\s+)?(?:(?P<start>start|beginning)|(?P<end>end)|(?P<middle>middle))"
    r"|the\s+(?P<nth>first|second|third|fourth|fifth|last|[1-5](?:st|nd|rd|th))\s+"
    rf"{_FULL_DAY_AS.format('day')})"
    r"\s+(?:of|in)\s+(?:(?P<rel>this|next|last|the)\s+month"
    rf"|(?P<month>{_MONTHS})(?:,?\s+(?P<year>(?:19|20)\d\d))?)",
    re.IGNORECASE,
)
# "early next month", "mid last month": said as _OF_MONTH reads them ("the start of next month")
_EARLY_REL_MONTH = re.compile(
    r"\b(?P<part>early|mid)[-\s]+(?P<rel>next|last|this)\s+month\b", re.IGNORECASE
)


def _part_of_month(match: re.Match[str]) -> str:
    part = "start" if match.group("part").lower() == "early" else "middle"
    return f"the {part} of {match.group('rel')} month"


# "on 27th last month", "the 3rd next month"
_DAY_OF_REL_MONTH = re.compile(
    r"\b(?:(?:on|by|from|till|until)\s+)?(?:the\s+)?(?P<dom>\d{1,2})(?:st|nd|rd|th)"
    r"\s+(?P<rel>last|next|this)\s+month\b",
    re.IGNORECASE,
)
_MID_MONTH = re.compile(rf"\bmid[-\s]?(?P<month>{_MONTHS})", re.IGNORECASE)  # "mid-April": the 15th
_WEEKEND = re.compile(
    # "long": a weekend with a holiday ("over the long weekend we drove up to the lake")
    r"\b(?:(?P<which>last|this|next)\s+(?:long\s+)?weekend|the\s+weekend\s+before\s+last"
    r"|(?P<gone>(?:the|this)\s+(?:past\s+weekend|weekend\s+(?:just\s+)?gone))"
    r"|(?P<at>(?:at|on|over)\s+the\s+(?:long\s+)?weekend))\b",
    re.IGNORECASE,
)
_WEEKEND_SATURDAY = {"last": -2, "this": 5, "next": 12, None: -9}  # days from this week's Monday
# The days of the year people name. Fixed ones by (month, day); Easter's by days from Easter
# Sunday (dateutil's Western Easter); the rest by (month, weekday, n): the nth such weekday of
# the month (Monday 0; n = -1 the last). Where countries differ the most common day is taken
# (Mother's Day: the second Sunday of May, as in the US, Canada, Australia and India; the UK's
# and Ireland's is "Mothering Sunday").
_LUNAR_NEW_YEAR = {
    2020: (1, 25), 2021: (2, 12), 2022: (2, 1), 2023: (1, 22), 2024: (2, 10), 2025: (1, 29),
    2026: (2, 17), 2027: (2, 6), 2028: (1, 26), 2029: (2, 13), 2030: (2, 3),
}  # fmt: skip
_DIWALI = {  # Lakshmi Puja, as India's list of public holidays has it
    2020: (11, 14), 2021: (11, 4), 2022: (10, 24), 2023: (11, 12), 2024: (10, 31),
    2025: (10, 20), 2026: (11, 8), 2027: (10, 29),
}  # fmt: skip
_DUSSEHRA = {
    2020: (10, 25), 2021: (10, 15), 2022: (10, 5), 2023: (10, 24), 2024: (10, 12),
    2025: (10, 2), 2026: (10, 20),
}  # fmt: skip
_GANESH_CHATURTHI = {
    2022: (8, 31), 2023: (9, 19), 2024: (9, 7), 2025: (8, 27), 2026: (9, 14),
}  # fmt: skip
_GUDI_PADWA = {2023: (3, 22), 2024: (4, 9), 2025: (3, 30), 2026: (3, 19)}
_RAKSHA_BANDHAN = {2023: (8, 30), 2024: (8, 19), 2025: (8, 9), 2026: (8, 28)}
_HOLI = {
    2020: (3, 10), 2021: (3, 29), 2022: (3, 18), 2023: (3, 8), 2024: (3, 25), 2025: (3, 14),
    2026: (3, 4), 2027: (3, 22),
}  # fmt: skip
# (the lunisolar ones by year: a year outside their table names no day)
_HOLIDAYS: dict[
    str, tuple[int, int] | int | tuple[int, int, int] | dict[int, tuple[int, int]]
] = {  # no apostrophes
    "easter sunday": 0,
    "easter monday": 1,
    "good friday": -2,
    "palm sunday": -7,
    "mothering sunday": -21,
    "shrove tuesday": -47,
    "pancake day": -47,
    "ash wednesday": -46,
    "easter": 0,
    "st patricks day": (3, 17),
    "paddys day": (3, 17),
    "canada day": (7, 1),
    "australia day": (1, 26),
    "anzac day": (4, 25),
    "burns night": (1, 25),
    "hogmanay": (12, 31),
    "thanksgiving": (11, 3, 4),
    "mothers day": (5, 6, 2),
    "fathers day": (6, 6, 3),
    "memorial day": (5, 0, -1),
    "labor day": (9, 0, 1),
    "christmas eve": (12, 24),
    "christmas day": (12, 25),
    "christmas": (12, 25),
    "boxing day": (12, 26),
    "new years eve": (12, 31),
    "new years day": (1, 1),
    "valentines day": (2, 14),
    "halloween": (10, 31),
    "bonfire night": (11, 5),
    "guy fawkes night": (11, 5),
    "juneteenth": (6, 19),
    "waitangi day": (2, 6),
    "heritage day": (9, 24),
    "freedom day": (4, 27),
    "st andrews day": (11, 30),
    "st davids day": (3, 1),
    "remembrance day": (11, 11),
    "veterans day": (11, 11),
    "bastille day": (7, 14),
    "cinco de mayo": (5, 5),
    "groundhog day": (2, 2),
    "april fools day": (4, 1),
    "fourth of july": (7, 4),
    "summer solstice": (6, 21),
    "winter solstice": (12, 21),
    "mlk day": (1, 0, 3),
    "martin luther king day": (1, 0, 3),
    "presidents day": (2, 0, 3),
    "early may bank holiday": (5, 0, 1),
    "spring bank holiday": (5, 0, -1),
    "lunar new year": _LUNAR_NEW_YEAR,
    "chinese new year": _LUNAR_NEW_YEAR,
    "diwali": _DIWALI,
    "deepavali": _DIWALI,
    "holi": _HOLI,
    "dussehra": _DUSSEHRA,
    "dasara": _DUSSEHRA,
    "vijayadashami": _DUSSEHRA,
    "ganesh chaturthi": _GANESH_CHATURTHI,
    "gudi padwa": _GUDI_PADWA,
    "raksha bandhan": _RAKSHA_BANDHAN,
    "rakhi": _RAKSHA_BANDHAN,
    "republic day": (1, 26),
    "melbourne cup day": (11, 1, 1),
    "melbourne cup": (11, 1, 1),
    "cup day": (11, 1, 1),
    "valentines": (2, 14),
}
_HOLIDAY_NAMES = (
    "(?:"
    + "|".join(
        re.sub(r"s( |$)", r"['’]?s\1", h).replace("st ", r"(?:st\.?|saint)\s+")
        for h in sorted(_HOLIDAYS, key=len, reverse=True)
    )
    + ")"
)
# a holiday whose name holds a weekday ("Easter Sunday", "Good Friday") names its day wherever
# it is said, and its weekday is no weekday of its own
_HOLIDAY_WEEKDAY = re.compile(rf"{_FULL_DAY}$", re.IGNORECASE)
_HOLIDAY = re.compile(rf"\b{_HOLIDAY_NAMES}\b", re.IGNORECASE)
# a holiday said as a time ("at Easter", "over Christmas", "last Halloween") is a time
# expression like any other; named alone ("the Christmas party") or as a purpose or bound
# ("coming for Christmas, landing on the 22nd", "before Christmas") only when nothing else is
_HOLIDAY_AT = re.compile(
    r"\b(?:(?P<which>last|next|this)|at|on|over|since|around)"
    rf"\s+(?:the\s+)?(?P<name>{_HOLIDAY_NAMES})\b",
    re.IGNORECASE,
)

# "the Saturday after New Year", "the Friday before Christmas": the first such weekday after
# (before) the holiday ("New Year" alone is New Year's Day here, and only here: "Happy new
# year" names no day)
_WEEKDAY_BY_HOLIDAY = re.compile(
    rf"\bthe\s+{_DAY_NAME}\s+(?P<side>after|before)\s+(?:the\s+)?"
    rf"(?P<name>{_HOLIDAY_NAMES}|new\s+year)\b",
    re.IGNORECASE,
)
# "the day before New Year's Eve", "two days before Christmas", "the day after Labor Day"
_DAYS_BY_HOLIDAY = re.compile(
    rf"\b(?:(?P<n>the|a|{_COUNT[1:-1]})\s+(?P<unit>days?|nights?|weeks?)|(?P<fortnight>a\s+fortnight))"
    rf"\s+(?P<side>before|after)\s+(?:the\s+)?(?P<name>{_HOLIDAY_NAMES})\b",
    re.IGNORECASE,
)
# "12/23", "31/10": a day and a month in figures, read only where one of them cannot be a month
_NUMERIC_DATE = re.compile(r"(?<![\d/.])(\d{1,2})/(\d{1,2})(?![\d/])")
# "saw in the new year on Calton Hill": New Year's Eve
_SEE_IN_NEW_YEAR = re.compile(
    r"\b(?:saw|see|seeing|seen|rang|ring|ringing|rung|welcomed?|welcoming)\s+in\s+the\s+new\s+year\b",
    re.IGNORECASE,
)

# A plan looks forward: "I'll fly on 28 October" is this October's, "I flew on 28 October" too.
_FUTURE = re.compile(
    r"\b(?:will|shall|going\s+to|gonna|plan(?:s|ning)?\s+to|postponed|rescheduled|next"
    r"|invited|is\s+booked|upcoming|coming\s+up|start(?:s|ing))\b"
    r"|'ll\b"
    # an arrangement: "we're flying out on the 23rd", "I'm seeing her on Friday", "booked the
    # movers for 23 March"
    r"|\b(?:am|is|are)\s+(?!being\b)\w+ing\b|(?:'m|'re)\s+(?!being\b)\w+ing\b"
    r"|\b(?:booked|scheduled|arranged|reserved|planned)\b[^.!?]*\bfor\b"
    # what one holds for an event to come: "got us tickets for the Bell Centre on July 11",
    # "approved my leave for the wedding on the 21st"
    r"|\b(?:tickets?|leave|time\s+off|days?\s+off)\s+(?:for|to)\b"
    # an event one has coming: "I've got a date with Cormac on Tuesday", "I have my exam on
    # Friday"
    r"|(?:(?:'ve|\bhave|\bhas)\s+got|\bhave|\bhas)\s+(?:a|an|my|the|our|his|her|their)\s+"
    r"(?:\w+\s+){0,2}(?:date|interview|meeting|exam|test"
    r"|party|wedding|match|game|gig|call|shift|flight|trip|class|lesson|session)s?\b"
    # someone's arrangement: "Mum's flying in on Tuesday", "Dave's coming over on the 3rd"
    r"|\w'?s\s+(?!being\b)\w+ing\s+(?:in|out|over|up|down|back|round|around|off|home)\b"
    # a plan moved to a day: "my appointment got moved to 11/19", "pushed back to Friday"
    # (not "we moved to Leeds": a day must follow)
    r"|\b(?:moved|pushed(?:\s+back)?|bumped|changed|brought\s+forward)\s+to\s+(?:the\s+)?"
    r"(?:\d{1,2}(?:/\d{1,2}|st|nd|rd|th)\b|(?:mon|tues|wednes|thurs|fri|satur|sun)day\b)",
    re.IGNORECASE,
)
# a subject and its verb ("I get", "we fly", "she starts"): a clause of its own tense
_OWN_VERB = re.compile(r"\b(?:i|we|he|she|they)\s+(?-i:[a-z]+)\b", re.IGNORECASE)
# a present copula: "gave notice, my last day is may 30" (the clause's own tense, as a verb)
_PRESENT_COPULA = re.compile(r"\b(?:is|are|am)\b", re.IGNORECASE)
# a plan by its noun alone: "first appointment was on the 26th" is past, its verb says so
_WEAK_FUTURE = re.compile(r"\bappointments?\b", re.IGNORECASE)
_PAST_TENSE = re.compile(
    # "got" but not "I've got" (what one has)
    r"\b(?:was|were|went|did|had|(?<!'ve )(?<!have )(?<!has )got|came|left|flew|ran|saw|met"
    r"|spent|bought|took|made|rang|spoke|froze|stole|hid|led|fed|dug|hung|lit|slid|shot"
    r"|stuck|struck|swung|wept|drew|grew|blew|forgave|became|fled|sought|dreamt|learnt"
    r"|began|won|lost|gave|found|sold|drove|wrote|broke|sat|told|said|felt|kept|slept|heard"
    r"|paid|fell|knew|thought|brought|caught|taught|wore|rode|swam|sang|ate|drank|fought"
    r"|threw|chose|forgot|woke|shook|stood|understood|sent|built|lent|meant|read\s+it"
    r"|didn't|wasn't|weren't|\w{3,}ed)\b",
    re.IGNORECASE,
)


def resolve_date(text: str, when: datetime | None) -> date | None:
    """The day ``text`` tells of, relative to when it was said (module docstring); the day
    it was said when it names none; None without ``when``."""
    if when is None:
        return None
    day = when.date()
    text = _MONTH_STOP.sub(r"\1 ", text)  # "On Aug. 30": the stop is the abbreviation's
    text = _EARLY_REL_MONTH.sub(_part_of_month, text)  # "early next month": its start
    text = month_names_masked(text)  # "Jan called yesterday": Jan is no January
    found = min(_expressions(text, when), default=None, key=lambda p: p[0])  # (position, day)
    if found is not None:
        return found[1] + _offset_before(text, found[0])
    if holiday := _HOLIDAY.search(text):  # only when nothing else names the day
        return _holiday(holiday.group(0), day, _tense(text, holiday.start())) or day
    return day


# "a week after my birthday on aug 3", "the day after my exam on the 23rd": the day named,
# moved; what lies between is a few words of the same clause, the event
_OFFSET = re.compile(
    rf"\b(?:(?P<the>the)|{_COUNT})\s+(?P<unit>days?|nights?|weeks?)\s+(?P<side>after|before)\b"
    r"(?=\s+(?!on\b)[^.!?;,]{1,40}$)",  # not "the day after, on Friday": Friday is that day
    re.IGNORECASE,
)


def _offset_before(text: str, at: int) -> timedelta:
    """The shift an offset just before the expression at ``at`` says ("three days after my
    exam on the 23rd": +3 days); none without one."""
    match = _OFFSET.search(text, 0, at)
    if match is None:
        return timedelta()
    shift = _span(match.group("the") or match.group(2), match.group("unit"))  # 2: _COUNT's
    return shift if match.group("side").lower() == "after" else -shift


def _holiday(name: str, day: date, tense: str) -> date | None:
    """The day a holiday's ``name`` (as :data:`_HOLIDAY` matched it) names, in the year said,
    the year before or after, by ``tense`` (as :func:`_day_of_month`); None for a lunisolar
    one outside its table."""
    key = " ".join(re.sub(r"['’.]", "", name.lower()).split())
    when = _HOLIDAYS[re.sub(r"^saint ", "st ", key)]
    years = (day.year - 1, day.year, day.year + 1)
    if isinstance(when, dict):
        options = [date(year, *when[year]) for year in years if year in when]
        return _by_tense(options, day, tense) if options else None
    if isinstance(when, int):
        options = [easter(year) + timedelta(days=when) for year in years]
    elif len(when) == 3:
        options = [_nth_weekday(year, when[0], when[1], when[2]) for year in years]
    else:
        return _nearest_of_year(when[0], when[1], day, tense)
    return _by_tense(options, day, tense)


def _nth_weekday(year: int, month: int, weekday: int, n: int) -> date:
    """The ``n``th ``weekday`` (Monday 0) of the month; ``n`` = -1 its last (the fifth one
    of a month with four: its last)."""
    first = date(year, month, 1)
    end = _month_end(year, month)
    if n < 0:
        return end - timedelta(days=(end.weekday() - weekday) % 7)
    found = first + timedelta(days=(weekday - first.weekday()) % 7 + 7 * (n - 1))
    return found if found <= end else found - timedelta(weeks=1)


def _of_month(match: re.Match[str], text: str, day: date) -> date | None:
    """The day an :data:`_OF_MONTH` match names."""
    rel = (match.group("rel") or "").lower()
    if rel:
        year, month = divmod(
            day.year * 12 + day.month - 1 + {"this": 0, "the": 0, "next": 1}.get(rel, -1), 12
        )
        months = [(year, month + 1)]
    else:
        month = month_number(match.group("month"))
        named = match.group("year")
        months = (
            [(int(named), month)]
            if named
            else [(y, month) for y in range(day.year - 1, day.year + 2)]
        )

    def of(year: int, month: int) -> date | None:
        end = _month_end(year, month)
        if match.group("lastday") or match.group("end"):
            return end
        if match.group("first") or match.group("start"):
            return date(year, month, 1)
        if match.group("middle"):
            return date(year, month, 15)
        if match.group("nth"):
            nth = match.group("nth").lower()
            n = _ORDINALS.get(nth) or int(nth[0])
            return _nth_weekday(year, month, _target(match), n)
        dom = int(match.group("dom"))
        return date(year, month, dom) if dom <= end.day else None

    options = [d for d in (of(y, m) for y, m in months) if d is not None]
    if not options:
        return None
    return options[0] if len(options) == 1 else _by_tense(options, day, _tense(text, match.start()))


def _expressions(text: str, when: datetime) -> Iterator[tuple[int, date]]:
    """``(position, day)`` of each kind of time expression the text holds (the first of each)."""
    day = when.date()
    if match := _DAYS_AGO.search(text):
        yield match.start(), day - timedelta(days=_count(match.group(1)))
    if match := _WEEKS_AGO.search(text):
        weeks = 2 if match.group(2) else _count(match.group(1))  # "a fortnight ago": 2
        yield match.start(), day - timedelta(weeks=weeks)
    if match := _MONTHS_AGO.search(text):
        months = _count(match.group(1)) * (12 if match.group(2)[0] in "yY" else 1)
        yield match.start(), _months_before(day, months)
    if (match := _LAST_WEEK_ON.search(text)) and _is_weekday(match):
        # "last week ... the Alhambra on Wednesday": that weekday of last week (from Monday;
        # "the week before last ... on the Wednesday": of the week before); at the start of
        # "last week", yielded first, so it wins over the week's -7 days
        monday = day - timedelta(days=day.weekday() + (14 if match.group("before") else 7))
        yield match.start(), monday + timedelta(days=_target(match))
    if (match := _IN_DAYS.search(text)) and _tense(text, match.start()) != "past":
        ahead = _span("two", "weeks") if match.group(3) else _span(match.group(1), match.group(2))
        yield match.start(), day + ahead  # group 3: a fortnight
    if match := _WEEKDAY_BY_HOLIDAY.search(text):  # "the Saturday after New Year"
        name = match.group("name")
        tense = _tense(text, match.start())
        named = (
            _holiday("new years day", day, tense)
            if re.fullmatch(r"new\s+year", name, re.IGNORECASE)
            else _holiday(name, day, tense)
        )
        if named is not None:
            gap = (_target(match) - named.weekday()) % 7 or 7
            yield (
                match.start(),
                named + timedelta(days=gap if match.group("side") == "after" else gap - 7),
            )
    if match := _SEE_IN_NEW_YEAR.search(text):
        yield match.start(), _holiday("new years eve", day, _tense(text, match.start())) or day
    if match := _HOLIDAY_AT.search(text):  # "at Easter", "over Christmas", "on Boxing Day"
        which = (match.group("which") or "").lower()
        tense = {"last": "past", "next": "future"}.get(which) or _tense(text, match.start())
        if (held := _holiday(match.group("name"), day, tense)) is not None:
            yield match.start(), held
    # before "next week" and "last week" alone, which start where it does
    if match := _WEEKDAY_OF_WEEK.search(text):
        weeks = 1 if match.group("next") else -2 if match.group("before") else -1
        monday = day - timedelta(days=day.weekday()) + timedelta(weeks=weeks)
        name = (match.group("day") or match.group("day2")).lower()
        yield match.start(), monday + timedelta(days=_weekday_index(name))
    for pattern, shift in _SHIFTS:
        if match := pattern.search(text):
            yield match.start(), day + timedelta(days=shift)
    if match := _WEEK_AGO_WEEKDAY.search(text):  # "a week ago Tuesday"
        yield match.start(), _last_weekday(match, day + timedelta(days=2)) - timedelta(weeks=1)
    if match := _DAY_OF_REL_MONTH.search(text):
        shift = {"last": -1, "this": 0, "next": 1}[match.group("rel").lower()]
        year, month = divmod(day.year * 12 + day.month - 1 + shift, 12)
        if int(match.group("dom")) <= _month_end(year, month + 1).day:
            yield match.start(), date(year, month + 1, int(match.group("dom")))
    if match := _MID_MONTH.search(text):  # "mid-April": the 15th, the nearest by tense
        month = month_number(match.group("month"))
        yield match.start(), _nearest_of_year(month, 15, day, _tense(text, match.start()))
    if (match := _NUMERIC_DATE.search(text)) and (named := _numeric_date(match, text, day)):
        yield match.start(), named
    if match := _DAYS_BY_HOLIDAY.search(text):  # "two days before Christmas", "a week after"
        shift = _span(match.group("n") or "two", match.group("unit") or "weeks")  # or a fortnight
        name = match.group("name")
        if (held := _holiday(name, day, _tense(text, match.start()))) is not None:
            yield match.start(), held + (shift if match.group("side") == "after" else -shift)
    if match := _DATE_OF_REL_YEAR.search(text):  # "on 14 feb last year": that year's
        dom = int(match.group("d1") or match.group("d2"))
        month = month_number(match.group("m1") or match.group("m2"))
        year = day.year + {"last": -1, "this": 0, "next": 1}[match.group("rel").lower()]
        if dom <= _month_end(year, month).day:
            yield match.start(), date(year, month, dom)
    if match := _LAST_MONTH.search(text):
        yield match.start(), (day.replace(day=1) - timedelta(days=1)).replace(day=1)
    if match := _LAST_YEAR.search(text):
        yield match.start(), day.replace(year=day.year - 1, month=1, day=1)
    if match := _WEEKEND.search(text):
        monday = day - timedelta(days=day.weekday())
        which = match.group("which")
        if match.group("gone"):  # "the weekend just gone"
            which = "last"
        elif match.group("at"):  # "at the weekend": by its tense, the coming one without
            which = "last" if _tense(text, match.start()) == "past" else "this"
        yield match.start(), monday + timedelta(days=_WEEKEND_SATURDAY[which and which.lower()])
    if match := _DAY_OF_MONTH.search(text):
        dom = _day_of_month(int(match.group(1)), day, _tense(text, match.start()))
        if dom is not None:
            yield match.start(), dom
    if (match := _OF_MONTH.search(text)) and (named := _of_month(match, text, day)) is not None:
        yield match.start(), named
    weekday_dom = _WEEKDAY_DOM.search(text)  # before the weekday alone, at the same place
    if weekday_dom and (named := _weekday_dom(weekday_dom, day, _tense(text, weekday_dom.start()))):
        yield weekday_dom.start(), named
    weekdays = text
    for match in _HOLIDAY.finditer(text):  # "for Easter Sunday": Easter's, no Sunday's
        if _HOLIDAY_WEEKDAY.search(match.group(0)):
            yield match.start(), _holiday(match.group(0), day, _tense(text, match.start())) or day
            weekdays = (
                weekdays[: match.start()] + " " * len(match.group(0)) + weekdays[match.end() :]
            )
    for match in _WEEKDAY.finditer(weekdays):
        if not _is_weekday(match) or _recurs(text, match):
            continue
        if _BEFORE_LAST.match(text, match.end()):  # "the Thursday before last"
            yield match.start(), _last_weekday(match, day) - timedelta(weeks=1)
            break
        on = _WEEK_ON_BEFORE.search(text, 0, match.start())  # "a week on Friday"
        week_on = on or _WEEK_ON_AFTER.match(text, match.end())  # "Thursday next week"
        if week_on and (match.group("which") or "").lower() not in ("last", "next"):
            start = on.start() if on else match.start()
            yield start, _weekday_ahead(match, day) + timedelta(weeks=1)
        else:
            # joined to "is", the weekday's own verb is present: the one to come ("thursday's
            # my bday and my friends forgot last year")
            tense = "future" if _weekday_is(text, match) else _tense(text, match.start())
            yield match.start(), _weekday(match, day, tense)
        break
    for match in SEASON.finditer(text):  # "last spring", "the summer of 2024": its first day
        if match.group("last") or match.group("year"):  # "I love summer" is no date
            ahead = _tense(text, match.start()) == "future"
            yield match.start(), season_interval(match, day, ahead=ahead)[0]
            break
    if (match := _DATE_WORD.search(text)) and (named := _named_date(text, when)) is not None:
        yield match.start(), named


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBER_WORDS[" ".join(word.lower().split())]


def _span(count: str, unit: str) -> timedelta:
    """``count`` ("the", "a", "three", "12") of ``unit`` ("day(s)", "night(s)", "week(s)")."""
    n = 1 if count.lower() == "the" else _count(count)
    return timedelta(weeks=n) if unit[:1].lower() == "w" else timedelta(days=n)


def _months_before(day: date, months: int) -> date:
    """The same day of the month ``months`` months before ``day`` (the month's last day
    where it is shorter: 31 March less a month is 28 or 29 February)."""
    index = day.year * 12 + day.month - 1 - months
    year, month = divmod(index, 12)
    return date(year, month + 1, min(day.day, _month_end(year, month + 1).day))


def _month_end(year: int, month: int) -> date:
    """The last day of ``month`` (1-12) of ``year``."""
    return date(year, month, calendar.monthrange(year, month)[1])


def _part_at(text: str, at: int, parts: re.Pattern[str]) -> str:
    """The part of ``text`` (a :data:`_SENTENCE` or a :data:`_CLAUSE`) holding ``at``."""
    for match in parts.finditer(text):
        if match.start() <= at < match.end():
            return match.group(0)
    return text


def _tense(text: str, at: int) -> str:
    """``"future"``, ``"past"`` or ``""`` (neither): of the clause holding ``at`` ("first
    meetup was wednesday, we're reading Americanah" told of the past), else of its sentence;
    a clause whose subject has a verb of no past is present, whatever its sentence says
    ("Found a flat ..., and I get the keys on 8 March": the keys are to come). A participle
    after "is", "gets" or "I'm" is no past ("my sister gets married on 12 March")."""
    clause = _part_at(text, at, _CLAUSE)
    for part in (clause, _part_at(text, at, _SENTENCE)):
        if _FUTURE.search(part):
            return "future"
        if any(not _NO_PAST_BEFORE.search(part, 0, m.start()) for m in _PAST_TENSE.finditer(part)):
            return "past"
        if _WEAK_FUTURE.search(part):
            return "future"
        if part is clause and (_OWN_VERB.search(part) or _PRESENT_COPULA.search(part)):
            return ""
    return ""


# (measured and left: the tense marker nearest the day instead of the first kind found, and a
# present verb read as the future: 8 and 20 fewer right of 683 labelled turns)
_NO_PAST_BEFORE = re.compile(
    r"\b(?:is|are|am|be|been|being|get|gets|getting|i'm|i’m|we're|we’re|they're|they’re"
    # a negated perfect tells of what has not happened yet ("i haven't started")
    r"|you're|you’re|haven't|haven’t|havent|hasn't|hasn’t|hasnt|not\s+yet)\s+$"
    # a wish for a thing done ("i want all the gifts bought", "need the car fixed")
    r"|\b(?:want|wants|need|needs)\s+(?:[\w'’]+\s+){1,3}$",
    re.IGNORECASE,
)


def _is_weekday(match: re.Match[str]) -> bool:
    """A weekday's name, not a word that begins like one ("sun", "sat", "wed", "mon"): the
    short forms count only after "on", "last", "this", "next", "coming", as the full name, or
    capitalised where they are no other word ("got my results back Mon")."""
    said = match.group(0).split()[-1]
    word = said.lower()
    return (
        word.endswith("day")
        or (match.group("which") is not None and len(word) >= 3)
        or said in _SHORT_DAYS
    )


_SHORT_DAYS = frozenset({"Mon", "Tue", "Tues", "Thu", "Thur", "Thurs", "Fri"})


# a weekday joined to a present copula: "On Saturday is my cousin's function", "thursday's
# my bday" (the weekday first in its clause: "the flat we saw on Monday is a maybe" is not),
# "the match is on Friday", "my last day is friday"
# ("wednesday's spin class got cancelled" is a possessive: its 's before a noun is no "is")
_IS_AFTER = re.compile(
    r"\s*(?:is\b|['’]s\s+(?:my|the|a|an|our|his|her|their|your|when|going|gonna|not|also"
    r"|still|just|fine|good|ok|okay|free|busy|booked)\b)",
    re.IGNORECASE,
)
_IS_BEFORE = re.compile(r"\b(?:is|are)\s+(?:on\s+)?$", re.IGNORECASE)
_CLAUSE_START = re.compile(r"(?:^|[,.!?;:—–])\s*$")


def _weekday_is(text: str, match: re.Match[str]) -> bool:
    """Whether the weekday ``match`` names is joined to "is": after it, leading its clause,
    or before it."""
    leads = _CLAUSE_START.search(text, 0, match.start())
    return bool(
        leads and _IS_AFTER.match(text, match.end()) or _IS_BEFORE.search(text, 0, match.start())
    )


def _recurs(text: str, match: re.Match[str]) -> bool:
    """Whether the weekday ``match`` names recurs ("thursday nights", "every Friday")."""
    return bool(_RECURRING.match(text, match.end()) or _EVERY.search(text, 0, match.start())) and (
        match.group("which") or ""
    ).lower() not in ("last", "next", "this", "coming")


def _target(match: re.Match[str]) -> int:
    """The weekday ``match`` names (Monday 0)."""
    return _weekday_index(match.group("day").lower())


def _weekday_index(name: str) -> int:
    """Monday 0 for "mon", "monday", ..."""
    return next(i for i, w in enumerate(_WEEKDAYS) if name.startswith(w[:3]))


def _weekday_ahead(match: re.Match[str], day: date) -> date:
    """The next day of ``match``'s weekday after ``day`` (1 to 7 days on)."""
    return day + timedelta(days=(_target(match) - day.weekday()) % 7 or 7)


def _last_weekday(match: re.Match[str], day: date) -> date:
    """ "last Friday": the latest Friday at least two days back (yesterday is "yesterday")."""
    before = day - timedelta(days=(day.weekday() - _target(match)) % 7 or 7)
    return before if (day - before).days >= 2 else before - timedelta(weeks=1)


def _weekday(match: re.Match[str], day: date, tense: str) -> date:
    """The day a weekday names: "last" the latest one at least two days back, "next" the one
    of next week (weeks from Monday), "coming" the one to come, else by the sentence's
    tense, else the nearer one (the one to come on a tie)."""
    target = _target(match)
    before = day - timedelta(days=(day.weekday() - target) % 7 or 7)
    after = _weekday_ahead(match, day)
    which = (match.group("which") or "").lower()
    # "last Friday" is the latest Friday at least two days back (yesterday is "yesterday"):
    # said on a Saturday 8 days ago, on a Sunday 2; "last Sunday" said on a Saturday is 6
    # days ago. "next Friday" is next week's, weeks from Monday: said on a Thursday, in 8
    # days; said on a Sunday, in 5
    if which == "last":
        return _last_weekday(match, day)
    if which == "next":  # the one of next week, weeks from Monday
        return day - timedelta(days=day.weekday()) + timedelta(days=7 + target)
    if which == "coming" or tense == "future":
        return after
    if tense == "past":
        return before
    if (day - before).days == 1:  # "Monday is Republic Day", said on a Tuesday: the next one
        return after
    return after if after - day <= day - before else before


def _day_of_month(dom: int, day: date, tense: str) -> date | None:
    """Day ``dom`` of the month said in, the month before or after: the nearest past one for a
    past sentence, the nearest one to come for a future one, else this month's unless it is
    over a week gone ("the sale is on the 6th" said on 22 November is 6 December), and the
    nearest where this month has no such day."""
    options = []
    for shift in (-1, 0, 1):
        year, month = divmod(day.year * 12 + day.month - 1 + shift, 12)
        try:
            options.append(date(year, month + 1, dom))
        except ValueError:  # the 31st of a month of 30 days
            continue
    this = [d for d in options if d.month == day.month]
    if not tense and this:  # neither: this month's, or next month's once over a week gone
        later = [d for d in options if d > this[0]]
        return later[0] if (day - this[0]).days > 7 and later else this[0]
    return _by_tense(options, day, tense) if options else None


def _weekday_dom(match: re.Match[str], day: date, tense: str) -> date | None:
    """The day a :data:`_WEEKDAY_DOM` match names: of the months around ``day``, the one
    whose day ``dom`` falls on the weekday said, by ``tense`` (as :func:`_by_tense`); where
    none does, the day of the month alone (:func:`_day_of_month`)."""
    dom, target = int(match.group("dom")), _target(match)
    options = []
    for shift in range(-2, 3):
        year, month = divmod(day.year * 12 + day.month - 1 + shift, 12)
        if (
            dom <= _month_end(year, month + 1).day
            and date(year, month + 1, dom).weekday() == target
        ):
            options.append(date(year, month + 1, dom))
    return _by_tense(options, day, tense) if options else _day_of_month(dom, day, tense)


def _numeric_date(match: re.Match[str], text: str, day: date) -> date | None:
    """The day a :data:`_NUMERIC_DATE` names when it can be read one way only (a part over
    12 is the day), the nearest by tense (as :func:`_nearest_of_year`); else None."""
    a, b = int(match.group(1)), int(match.group(2))
    if a > 12 and 1 <= b <= 12:
        dom, month = a, b
    elif b > 12 and 1 <= a <= 12:
        month, dom = a, b
    else:
        return None
    try:
        return _nearest_of_year(month, dom, day, _tense(text, match.start()))
    except ValueError:  # "31/4"
        return None


def _nearest_of_year(month: int, dom: int, day: date, tense: str) -> date:
    """``month``/``dom`` of the year said in, the year before or after, as :func:`_day_of_month`."""
    options = []
    for shift in (-1, 0, 1):
        try:
            options.append(date(day.year + shift, month, dom))
        except ValueError:  # 29 February of a year without one
            continue
    if not options:
        raise ValueError(f"no day {dom} in month {month}")
    return _by_tense(options, day, tense)


def _by_tense(options: list[date], day: date, tense: str) -> date:
    """The one of ``options`` nearest ``day`` among the past ones for a ``"past"`` tense, the
    ones to come for ``"future"`` (all of them when none is), the one to come on a tie."""
    if tense == "past":
        options = [d for d in options if d <= day] or options
    elif tense == "future":
        options = [d for d in options if d >= day] or options
    return min(options, key=lambda d: (abs((d - day).days), d < day))


def _next_year(day: date) -> date | None:
    try:
        return day.replace(year=day.year + 1)
    except ValueError:  # 29 February
        return None


_YEARLESS_MONTH = re.compile(rf"^(?!.*\b(?:19|20)\d\d\b)(?=.*\b(?:{_MONTHS}))", re.IGNORECASE)


def _named_date(text: str, when: datetime) -> date | None:
    """The first date dateparser finds in ``text`` holding a month, an ISO date or a year
    (a month's first day when no day is said)."""
    from dateparser.search import search_dates

    day = when.date()
    text = _DAY_RANGE.sub(r"\1", text)
    at = _DATE_WORD.search(text)
    tense = _tense(text, at.start()) if at else ""
    if (told := DAY_MONTH.search(text)) and at and told.start() <= at.start() < told.end():
        month = month_number(told.group("month") or told.group("month2"))
        dom = int(told.group("day") or told.group("day2"))
        try:
            if told.group("year"):
                return date(int(told.group("year")), month, dom)
            return _nearest_of_year(month, dom, day, tense)
        except ValueError:  # "31 April", "29 February" of a year without one
            return None
    settings = {
        "RELATIVE_BASE": when.replace(tzinfo=None),
        "PREFER_DATES_FROM": "future" if tense == "future" else "past",
        "PREFER_DAY_OF_MONTH": "first",
        "PREFER_MONTH_OF_YEAR": "first",
        "RETURN_AS_TIMEZONE_AWARE": False,
        "TIMEZONE": "UTC",
    }
    found = search_dates(text, languages=["en"], settings=settings)
    span, named_at = next(((s, a) for s, a in found or () if _DATE_WORD.search(s)), (None, None))
    if span is None or named_at is None:
        return None
    named = named_at.date()
    if tense == "" and _YEARLESS_MONTH.search(span):
        # "the wedding is on 14 September", said in August: a date without its year, in a
        # sentence that tells no past, is the nearer of its two occurrences (dateparser's
        # "past" gives last year's); "I moved to Porto on 12 March" keeps the past one
        later = _next_year(named)
        if later is not None and later - day < day - named:
            return later
    return named
