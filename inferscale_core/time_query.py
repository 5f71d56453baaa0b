"""The time a question asks about: an interval of days, and whether it looks at the past.

"What did I do in September 2024?" names ``[2024-09-01, 2024-10-01)``; "last March", "in
2023", "spring 2024", "at the start of 2024" (its first quarter; "the end of" its last, "the
first half", "mid-2024", "Q3 2024"), "last month", "last weekend", "on 12 March" name theirs
against the day the question is asked (``today``). A month or season without a year is the
latest one that has begun ("in September", asked in May 2025: September 2024). The retriever
puts the facts that held in the interval first (:meth:`FactLog.facts_valid_in`).

:func:`asks_about_past` says whether a question wants an earlier state of things: it names an
interval that ended before today, or says "used to", "before", "previously", "my old ...",
"did I live/work ...". Only then does the retriever rank a fact that stopped being true as it
ranks the others; otherwise it prefers the fact that replaced it.
"""

from __future__ import annotations

import functools
import re
from datetime import date, timedelta

from inferscale_core.retriever_people import KIN_WORDS

Interval = tuple[date, date]  # [start, end): the end day is not in it

_MONTH_NUMBERS = {
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "may": 5,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
}
_MONTH = (
    r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}

# "12 March", "the 3rd of May", "August 10th, 2024" (also read by turn_dates.py in turns)
DAY_MONTH = re.compile(
    rf"\b(?:on\s+)?(?:(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}"
    # "June 19", and "back in June — the 19th" (a day said after its month, set apart)
    rf"|{_MONTH.replace('month', 'month2')}"
    r"(?:\s+|\s*[—–-]+\s*the\s+(?=\d{1,2}(?:st|nd|rd|th)))"
    r"(?P<day2>\d{1,2})(?:st|nd|rd|th)?)\b"
    rf"(?:,?\s+{_YEAR})?",
    re.IGNORECASE,
)
_MONTH_YEAR = re.compile(
    rf"\b(?:(?P<last>last|this)\s+)?{_MONTH}\b(?:\s+(?:of\s+)?{_YEAR})?", re.IGNORECASE
)
_MODAL = frozenset({"may", "mar", "march"})  # "may I", "to march": a month only as "May"
SEASON = re.compile(
    rf"\b(?:(?P<last>last|this|next)\s+)?(?P<season>spring|summer|autumn|fall|winter)\b"
    rf"(?:\s+(?:of\s+)?{_YEAR})?",
    re.IGNORECASE,
)
"""A season, maybe with "last", "this" or "next" before it and a year after ("last spring",
"the summer of 2024"); also read by turn_dates.py in turns."""
# a year on its own: after a preposition, or ending the question ("2000 euros" is no year)
_YEAR_ONLY = re.compile(
    rf"\b(?:in|during|of|since|before|throughout|from)\s+{_YEAR}\b|\b(?P<y2>(?:19|20)\d\d)(?=\s*\?)",
    re.IGNORECASE,
)
# a part of a year: "at the start of 2024", "in the first half of last year", "late 2023",
# "mid-2024", "Q3 2024": its first month and the month after its last
_YEAR_PART = re.compile(
    r"\b(?:(?:the\s+)?(?P<part>start|beginning|first\s+half|second\s+half|middle|end"
    r"|(?:first|second|third|fourth|last)\s+quarter)\s+of"
    r"|(?P<early>early|mid|late)-?|(?P<q>q[1-4]))"
    rf"\s*(?:{_YEAR}|(?P<which>last|this)\s+year)\b",
    re.IGNORECASE,
)
_PART_MONTHS = {
    "start": (1, 4), "beginning": (1, 4), "early": (1, 4), "first quarter": (1, 4),
    "q1": (1, 4), "second quarter": (4, 7), "q2": (4, 7), "first half": (1, 7),
    "middle": (5, 9), "mid": (5, 9), "second half": (7, 13), "third quarter": (7, 10),
    "q3": (7, 10), "end": (10, 13), "late": (10, 13), "fourth quarter": (10, 13),
    "last quarter": (10, 13), "q4": (10, 13),
}  # fmt: skip
_RELATIVE = re.compile(
    r"\b(?P<which>last|this|past|previous)\s+(?P<unit>week|weekend|month|year)\b"
    r"|\b(?P<day>yesterday|today)\b",
    re.IGNORECASE,
)
_PAST = re.compile(
    r"\b(?:used\s+to|before|previously|formerly|back\s+then|at\s+the\s+time|originally"
    r"|(?:my|our)\s+(?:old|previous|former|first|last)|ex-?(?:girlfriend|boyfriend|wife|husband)"
    r"|did|when\s+i\s+(?:lived|worked|was)|was\s+(?:i|we)|were\s+(?:we|you)"
    r"|was\s+my|were\s+my|had\s+i)\b",
    re.IGNORECASE,
)


_MONTH_WORD = re.compile(r"\b" + _MONTH.replace("(?P<month>", "(?:") + r"\b", re.IGNORECASE)
# what makes a month word a month: a preposition or a day before it ("in June", "12 June",
# "end of June"), a day, "of" or a year after it ("June 5", "June of 2024", "June, 2024")
_MONTH_CUE_BEFORE = re.compile(
    r"(?:\b(?:in|during|since|until|till|by|from|before|after|through|throughout|early|mid"
    r"|late|of|around|over|last|this|next|every|each)|\d(?:st|nd|rd|th)?|[-/])\s*$",
    re.IGNORECASE,
)
_MONTH_CUE_AFTER = re.compile(r"\s*(?:\d|of\b|,\s*(?:19|20)\d\d)", re.IGNORECASE)
_CAPITALIZED_WORD = re.compile(r"\s+[A-Z][a-z]")
# "my nan June", "Auntie May", "cousin April": a person the speaker names by relation
_RELATION_BEFORE = re.compile(
    rf"\b(?:{KIN_WORDS}|nan|nana|nanna|gran|granny|grandad|auntie|aunty|mam)\s+$", re.IGNORECASE
)

# "march" the verb: after a modal, a subject or "have to" ("we just have to march on",
# "they'll march"); "moved to march", "from January to March" stay months
_MARCH_VERB_BEFORE = re.compile(
    r"(?:\b(?:will|would|shall|should|must|can|could|might|i|we|you|they|let's|let’s|lets"
    r"|(?:have|has|had|got|need|needs|want|wants|going|ready|used)\s+to)|['’]ll)\s+$",
    re.IGNORECASE,
)


def month_names_masked(text: str) -> str:
    """``text`` with each month word that is a person's name (or "march" the verb) blanked out,
    same length ("Where does Jun Mesel keep the camera?" asked of no June; "Jan called
    yesterday" said yesterday).
    A capitalised month word with no time cue around it (:data:`_MONTH_CUE_BEFORE`, ``_AFTER``)
    is a name when the next word is capitalised too ("April Ludgate") or when it is a
    three-letter abbreviation ("Jan", "Jun"); "May" is left to the callers' modal-verb rule."""

    def blank(match: re.Match[str]) -> str:
        word = match.group(0)
        if word.casefold() == "march" and _MARCH_VERB_BEFORE.search(text, 0, match.start()):
            return "_" * len(word)  # "we just have to march on": the verb
        if not word[0].isupper() or word.casefold() == "may":
            return word
        if _MONTH_CUE_BEFORE.search(text, 0, match.start()) or _MONTH_CUE_AFTER.match(
            text, match.end()
        ):
            return word
        if _RELATION_BEFORE.search(text, 0, match.start()):
            return "_" * len(word)
        if _CAPITALIZED_WORD.match(text, match.end()) or len(word) == 3:
            return "_" * len(word)
        return word

    return _MONTH_WORD.sub(blank, text)


def month_number(name: str) -> int:
    """1-12 for a month's name or its abbreviation ("March", "sept", "Aug")."""
    return _MONTH_NUMBERS[name[:3].casefold()]


def _month(year: int, month: int) -> Interval:
    start = date(year, month, 1)
    end = date(year + (month == 12), month % 12 + 1, 1)
    return start, end


def _latest_begun(today: date, month: int) -> int:
    """The year of the latest ``month`` that has begun by ``today``."""
    return today.year if month <= today.month else today.year - 1


def season_interval(
    match: re.Match[str], today: date, year: int | None = None, ahead: bool = False
) -> Interval:
    """The months of a :data:`SEASON` match (northern meteorological seasons: spring from
    March, summer June, autumn September, winter December): of ``year`` (or the match's own
    year) when one is named; else "last" the latest that has ended, "next" the first to begin
    after ``today``, and otherwise the latest begun by ``today`` ("this", ``ahead`` — a plan:
    "this summer we'll ...", said in March — the next one when that has ended)."""
    first = _SEASONS[match.group("season").casefold()]
    which = (match.group("last") or "").casefold()
    named = year or (int(match.group("year")) if match.group("year") else None)
    start_year = named or _latest_begun(today, first)
    start = date(start_year, first, 1)
    end = date(start_year + (first + 3 > 12), (first + 2) % 12 + 1, 1)
    if named is None and which == "last" and end > today:  # "last winter": the latest ended
        start, end = start.replace(year=start.year - 1), end.replace(year=end.year - 1)
    elif named is None and (
        which == "next" and start <= today or which == "this" and ahead and end <= today
    ):
        start, end = start.replace(year=start.year + 1), end.replace(year=end.year + 1)
    return start, end


def _year_named(question: str) -> str | None:
    match = _YEAR_ONLY.search(question)
    return None if match is None else match.group("year") or match.group("y2")


def question_interval(question: str, today: date) -> Interval | None:
    """The days the question names (the first time expression found), else None."""
    question = month_names_masked(question)
    if match := DAY_MONTH.search(question):
        day = int(match.group("day") or match.group("day2"))
        month = month_number(match.group("month") or match.group("month2"))
        year = int(match.group("year")) if match.group("year") else None
        if year is None:
            year = today.year if (month, day) <= (today.month, today.day) else today.year - 1
        try:
            start = date(year, month, day)
        except ValueError:
            start = None
        if start is not None:
            return start, start + timedelta(days=1)
    for match in _MONTH_YEAR.finditer(question):
        name = match.group("month")
        spoken = name[0].isupper() or match.group("year") or match.group("last")
        asks_leave = re.match(r"may\s+(?:i|we|you)\b", question[match.start() :], re.IGNORECASE)
        if name.casefold() in _MODAL and (not spoken or asks_leave):
            continue
        month = month_number(name)
        if named := match.group("year") or _year_named(question):
            return _month(int(named), month)
        year = _latest_begun(today, month)
        if (match.group("last") or "").casefold() == "last" and (year, month) == (
            today.year,
            today.month,
        ):
            year -= 1  # "last May", asked in May: a year ago
        return _month(year, month)
    if match := _YEAR_PART.search(question):
        part = " ".join((match.group("part") or match.group("early") or match.group("q")).split())
        first, after = _PART_MONTHS[part.casefold()]
        year = int(match.group("year") or today.year - (match.group("which").casefold() == "last"))
        return date(year, first, 1), _month(year, after - 1)[1]
    if match := SEASON.search(question):
        named = match.group("year") or _year_named(question)  # "summer holiday in 2024"
        return season_interval(match, today, int(named) if named else None)
    if match := _RELATIVE.search(question):
        if match.group("day"):
            day = today - timedelta(days=match.group("day").casefold() == "yesterday")
            return day, day + timedelta(days=1)
        which, unit = match.group("which").casefold(), match.group("unit").casefold()
        back = which != "this"
        if unit == "week":
            monday = today - timedelta(days=today.weekday() + 7 * back)
            return monday, monday + timedelta(days=7)
        if unit == "weekend":
            saturday = today - timedelta(days=today.weekday()) + timedelta(days=5 - 7 * back)
            return saturday, saturday + timedelta(days=2)
        if unit == "month":
            first = today.replace(day=1)
            if back:
                first = (first - timedelta(days=1)).replace(day=1)
            return _month(first.year, first.month)
        year = today.year - back
        return date(year, 1, 1), date(year + 1, 1, 1)
    if match := _YEAR_ONLY.search(question):
        year = int(match.group("year") or match.group("y2"))
        return date(year, 1, 1), date(year + 1, 1, 1)
    return None


_NOW_WORDS = r"now|currently|these\s+days|at\s+the\s+moment|nowadays|rn"
_PRESENT = re.compile(
    rf"\b(?:{_NOW_WORDS}|still|any\s+more|anymore|do|does|am|is|are|have|has|can|can't|cannot"
    r"|should|must|remind\s+me|whats|whos|wheres|hows)\b|'s\b|'m\b|'re\b"
    # a verb of the present with its subject the question word: "who manages me?", "which
    # organisation employs me?", "how much goes to the landlord?"
    r"|^\s*(?:who|what|which(?:\s+[\w-]+){0,2}|how\s+much)\s+"
    r"(?!(?:was|has|is|does|this|his|its|bus|gas|us)\b)[a-z]{2,}[^s\W]s\b",
    re.IGNORECASE,
)
# past tense, and the present perfect ("Which races have I done?")
_PAST_TENSE = re.compile(
    r"\b(?:did|was|were|had|used|ago|went|got|ever)\b|\bha(?:ve|s)\s+(?:i|we|you|he|she|they)\b",
    re.IGNORECASE,
)


# "have got" is having, now: "What mobile have I got?", "I've got a cat" (not "got" as past)
_HAVE_GOT = re.compile(
    r"\b(?:ha(?:ve|s)|'ve|'s)\s+(?:(?:i|we|you|he|she|they)\s+)?got\b", re.IGNORECASE
)

_OWN = re.compile(r"\b(?:i|i'm|my|me|mine|we|we're|our|ours|us)\b", re.IGNORECASE)
# a time that is now: with no one named, a question said so asks of the one asking
_NOW = re.compile(rf"\b(?:{_NOW_WORDS}|at\s+present)\b", re.IGNORECASE)
_CAPITAL = re.compile(r"\b[A-Z]")  # a word with a capital: a name, or the question's first


def asks_about_present(question: str, today: date) -> bool:
    """Whether the question asks how things are now for the one asking ("What's my job?",
    "Where do I live?", "Am I still at Siemens?", "What mobile have I got?", "Where's home
    these days?"): in the first person, or saying "now" and naming no one ("Where is Alex
    from work based now?" asks of Alex), present tense, no past tense, no time named, not the
    past."""
    return (
        (_OWN.search(question) is not None or _now_of_the_asker(question))
        and _PRESENT.search(question) is not None
        and _PAST_TENSE.search(_HAVE_GOT.sub("have", question)) is None
        and question_interval(question, today) is None
        and not asks_about_past(question, today)
    )


def _now_of_the_asker(question: str) -> bool:
    """Says "now" in its own words, and no capitalized word but its first (no one named)."""
    return _NOW.search(question) is not None and _CAPITAL.search(question.strip(), 1) is None


# a statement that tells of an earlier state in its own words: "My old job was at the post
# office", "I used to live in Leeds", "my ex-boss", "back when I was a nurse"
_STATES_PAST = re.compile(
    r"\b(?:used\s+to|formerly|back\s+when"
    r"|(?:my|our)\s+(?:(?:old|previous|former|ex)\s+|ex-)(?!(?:man|lady|friends?|mates?)\b)\w+)\b",
    re.IGNORECASE,
)


# ... unless they tell what holds now beside it: "my old dentist is too far now, so I found one
# here", "new dentist yesterday, she complimented the crown my old dentist did"
_STATES_NOW = re.compile(rf"\b(?:{_NOW_WORDS}|at\s+present|instead|new)\b", re.IGNORECASE)


@functools.lru_cache(maxsize=8192)  # the same facts come back search after search
def states_past(text: str) -> bool:
    """Whether a fact's own words place it before now ("My old job was at the post office",
    "I used to run") and say nothing of now ("... so I found a new one"): for a question
    about the present the retriever puts it after the others, as it does a fact the log
    closed."""
    return _STATES_PAST.search(text) is not None and _STATES_NOW.search(text) is None


def asks_about_past(question: str, today: date) -> bool:
    """Whether the question wants an earlier state (module docstring)."""
    if _PAST.search(question):
        return True
    interval = question_interval(question, today)
    return interval is not None and interval[1] <= today
