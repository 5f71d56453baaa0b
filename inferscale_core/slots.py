# ruff: noqa: E501  (one pattern per line reads better than patterns cut across lines)
"""What a fact says about a single-valued attribute of someone: its *slots*.

A person lives in one place, has one employer, one salary, one partner at a time. When a new
fact sets such an attribute to another value ("We finally moved to Porto" after "I live in
Lisbon"), the older fact stopped being true that day: the fact log closes it
(:meth:`FactLog.close_replaced`) and retrieval prefers the open one unless a question asks about
the past. A fact can also end an attribute without a successor ("I don't work at Siemens any
more", "Rex died in March").

A slot is ``(holder, attribute, value)``:

* ``holder``: who it is about. "self" for a first-person statement of the user ("I", "we",
  "my"); a named speaker's own statements ("Caroline: I moved to...") are hers, case-folded.
  Statements about third people make no slot (they are not told apart reliably by patterns).
* ``attribute``: one of :data:`ATTRIBUTES`.
* ``value``: the new value, case-folded, articles dropped, at most :data:`VALUE_WORDS` words
  (two values are the same when one starts with the other: "porto" and "porto portugal").

The decision is made by patterns, not by embedding similarity: a pattern says which attribute
changed; similarity cannot tell "I live in Porto" from "My cousin lives in Porto". The patterns
are checked on labelled pairs (tests/unit/test_slots.py) and their effect on retrieval by
``bench updates`` (docs/BENCHMARKS.md, "What is true now").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SELF = "self"
VALUE_WORDS = 3

ATTRIBUTES = (
    "residence",  # the city or place one lives in
    "employer",  # who one works for
    "role",  # what one works as
    "salary",
    "partner",
    "dog",
    "cat",
    "diet",
    "commute",
    "car",
    "phone",
    "gym",
    "manager",
    "favourite",  # "favourite X" keeps X in the attribute: "favourite band"
    "book",  # the one being read
    "course",  # the class one is in ("the B1 course")
    "instrument",  # the one being learnt
    "rent",
)

# The value of a place, an employer or a name: a capitalized run ("Porto", "St John's",
# "New York"); up to a stop, a comma, a conjunction or a time phrase.
_NAME = r"(?P<v>(?-i:[A-Z0-9][\w'&.-]*)(?:\s+(?-i:[A-Z][\w'&.-]*|(?:of|de|da|do)\b))*)"
# Any short phrase (a job title, a diet, a band): up to a stop or a clause boundary.
_PHRASE = r"(?P<v>[\w'&$€£.,-]+(?:\s+(?!and\b|but\b|since\b|because\b|now\b|so\b|with\b)[\w'&$€£.-]+){0,4})"
_NOW = r"(?:\s+(?:now|just|finally|recently|also|officially|actually))?"
_I = r"(?:\bi|\bwe)"

_PETS = {
    "dog": "dog",
    "puppy": "dog",
    "beagle": "dog",
    "labrador": "dog",
    "lab": "dog",
    "terrier": "dog",
    "poodle": "dog",
    "retriever": "dog",
    "spaniel": "dog",
    "collie": "dog",
    "cat": "cat",
    "kitten": "cat",
}
_PET = "(?P<a>" + "|".join(_PETS) + ")"
_PARTNER = r"(?:girlfriend|boyfriend|partner|wife|husband|fianc[ée]e?)"
_SINGLE = r"(?P<a>car|phone|gym|manager|boss)"
_ROLE_OF = r"(?P<a>girlfriend|boyfriend|partner|wife|husband|manager|boss)"
_PHONES = r"(?:iphone|pixel|galaxy|oneplus|xiaomi|fairphone|nokia|motorola|huawei)"
_CARS = (
    r"(?:tesla|toyota|renault|volkswagen|vw|ford|bmw|audi|mercedes|fiat|peugeot|honda|nissan"
    r"|kia|hyundai|skoda|seat|volvo|mazda|opel|citro[eë]n|dacia|mini|polestar)"
)
# The head noun of a job title: "analytics engineer", "senior nurse", "head chef".
_JOBS = (
    r"(?:engineer|developer|programmer|designer|analyst|scientist|architect|researcher|manager"
    r"|director|consultant|accountant|lawyer|nurse|doctor|teacher|lecturer|professor|editor"
    r"|writer|journalist|translator|chef|cook|technician|administrator|specialist|officer"
    r"|intern|lead|tester|electrician|plumber|pharmacist|therapist|paramedic|barista|waiter"
    r"|cashier|librarian|photographer|producer|coordinator|recruiter|secretary|founder)"
)
_JOB = rf"(?P<v>(?:[\w-]+\s+){{0,3}}?{_JOBS})\b"
_AMOUNT = r"(?P<v>[$€£]?\s?\d[\d.,]*)"
_INSTRUMENTS = (
    r"(?:guitar|piano|violin|cello|drums|bass|ukulele|saxophone|sax|flute|trumpet|clarinet"
    r"|harp|accordion|banjo|keyboard)"
)

# (attribute or None = the pattern's group "a", pattern) for the slots a fact sets.
_SETS: tuple[tuple[str | None, re.Pattern[str]], ...] = tuple(
    (attribute, re.compile(pattern, re.IGNORECASE))
    for attribute, pattern in (
        (
            "residence",
            rf"{_I}(?:'ve|\s+have)?{_NOW}\s+(?:moved|relocated)\s+(?:back\s+)?(?:to|into)\s+{_NAME}",
        ),
        (
            "residence",
            rf"{_I}{_NOW}\s+(?:live|(?:'m|\s+am|'re|\s+are)\s+(?:now\s+)?living)\s+in\s+{_NAME}",
        ),
        ("residence", rf"{_I}(?:'m|\s+am|'re|\s+are){_NOW}\s+based\s+in\s+{_NAME}"),
        (
            "residence",
            rf"\b(?:my|our)\s+(?:new\s+)?(?:home|flat|apartment|house|place)\s+is\s+in\s+{_NAME}",
        ),
        (
            "employer",
            rf"\bi{_NOW}\s+(?:work|(?:'m|\s+am)\s+(?:now\s+)?working)\s+(?:as\s+an?\s+[\w\s-]+?\s+)?(?:at|for)\s+{_NAME}",
        ),
        (
            "employer",
            rf"\bi{_NOW}\s+(?:started|start|began|begin)\s+(?:a\s+new\s+job\s+|my\s+new\s+job\s+|working\s+|work\s+)?(?:at|with|for)\s+{_NAME}",
        ),
        ("employer", rf"\b(?:started|starting)\s+(?:work\s+|a\s+new\s+job\s+)?at\s+{_NAME}"),
        ("residence", rf"^(?:just\s+|finally\s+)?moved\s+(?:back\s+)?to\s+{_NAME}"),
        (
            "employer",
            rf"\bi\s+(?:got|accepted|took)\s+(?:a|an|the)\s+(?:new\s+)?(?:job|position|offer)\s+(?:as\s+an?\s+[\w\s-]+?\s+)?(?:at|with|from)\s+{_NAME}",
        ),
        ("employer", rf"\bi(?:'ve|\s+have)?\s+(?:was\s+|been\s+|got\s+)?hired\s+by\s+{_NAME}"),
        ("employer", rf"\bmy\s+(?:new\s+)?(?:employer|company)\s+is\s+{_NAME}"),
        # the first days of a job: "First week at Zalando done", "my new job at Bosch"
        (
            "employer",
            rf"\b(?:first|1st)\s+(?:full\s+)?(?:day|week|month)\s+(?:at|with)\s+(?:the\s+new\s+job\s+at\s+)?{_NAME}",
        ),
        ("employer", rf"\b(?:my|the)\s+new\s+(?:job|position|role)\s+(?:at|with)\s+{_NAME}"),
        (
            "role",
            rf"\bi{_NOW}\s+(?:work|(?:'m|\s+am)\s+(?:now\s+)?working)\s+as\s+(?:an?\s+)?{_PHRASE}",
        ),
        (
            "role",
            rf"\b(?:started|start|began|got\s+a\s+(?:new\s+)?job|hired)\b[^.]*?\bas\s+(?:an?\s+)?{_PHRASE}",
        ),
        (
            "role",
            rf"\bmy\s+(?:new\s+)?(?:job|role|position|title)\s+is\s+(?:now\s+)?(?:as\s+)?(?:an?\s+)?{_PHRASE}",
        ),
        # a title said without "I work as": "Being a nurse is ...", "promoted to senior
        # engineer", "I'm a data analyst now" (a job's head noun: _JOBS)
        ("role", rf"^(?:\w+\s+){{0,2}}?being\s+(?:an?\s+)?{_JOB}"),
        ("role", rf"\bpromoted\s+to\s+(?:an?\s+)?{_JOB}"),
        ("role", rf"\bi(?:'m|\s+am){_NOW}\s+(?:an?\s+)(?!lot\b|bit\b){_JOB}"),
        (
            "salary",
            rf"\bi{_NOW}\s+(?:earn|make|get\s+paid)\s+(?:about\s+|around\s+)?(?P<v>[$€£]?\s?\d[\d.,]*\s*k?)",
        ),
        (
            "salary",
            r"\bmy\s+(?:new\s+)?(?:salary|pay|income|wage)\s+is\s+(?:now\s+)?(?:about\s+|around\s+)?(?P<v>[$€£]?\s?\d[\d.,]*\s*k?)",
        ),
        ("partner", rf"\bmy\s+(?:new\s+)?{_PARTNER}(?:'s\s+name)?(?:\s+is|,)?\s+{_NAME}"),
        (
            "partner",
            rf"\bi(?:'m|\s+am){_NOW}\s+(?:dating|seeing|engaged\s+to|married\s+to|with)\s+{_NAME}",
        ),
        (
            None,
            rf"\bmy\s+(?:new\s+)?{_PET}(?:'s\s+name)?(?:\s+is(?:\s+called|\s+named)?|,)?\s+{_NAME}",
        ),
        (
            None,
            rf"{_I}\s+(?:just\s+)?(?:got|adopted|have|bought|rescued)\s+a\s+(?:new\s+)?(?:\w+\s+)?{_PET}\s+(?:called|named)\s+{_NAME}",
        ),
        (
            "diet",
            rf"\b(?:i(?:'m|\s+am)|we(?:'re|\s+are)){_NOW}\s+(?:fully\s+|a\s+)?(?P<v>vegan|vegetarian|pescatarian|keto|paleo)\b",
        ),
        (
            "diet",
            r"\b(?:i|we)(?:'ve|\s+have)?\s+(?:went|gone|turned|became|become|switched\s+to|go|am\s+going)\s+(?:fully\s+)?(?P<v>vegan|vegetarian|pescatarian|keto|paleo)\b",
        ),
        (
            "commute",
            rf"\bi{_NOW}\s+(?:commute|get|go)\s+to\s+(?:work|the\s+office)\s+(?P<v>by\s+\w+|on\s+(?:foot|the\s+\w+)|walking)",
        ),
        (
            "commute",
            rf"\bi{_NOW}\s+(?P<v>cycle|bike|walk|drive)\s+to\s+(?:work|the\s+office)",
        ),
        (
            "commute",
            rf"\bi{_NOW}\s+take\s+the\s+(?:[\w-]+\s+){{0,3}}?(?P<v>metro|bus|train|tram|subway|underground|tube|ferry)\s+to\s+(?:work|the\s+office)",
        ),
        ("car", rf"\bi{_NOW}\s+drive\s+(?:a|an)\s+{_PHRASE}"),
        (None, rf"\bmy\s+(?:new\s+)?{_SINGLE}\s+is\s+(?:now\s+)?(?:a|an|the)?\s*{_PHRASE}"),
        (None, rf"\bmy\s+(?:new\s+)?favou?rite\s+(?P<a>\w+)\s+is\s+(?:now\s+)?{_PHRASE}"),
        # "Priya is my manager", "Lena is my girlfriend": the name first
        (None, rf"^{_NAME}\s+is\s+(?:now\s+)?my\s+(?:new\s+)?{_ROLE_OF}\b"),
        (
            "partner",
            rf"^{_NAME}\s+and\s+i\s+(?:are|got){_NOW}\s+(?:together|dating|a\s+couple|engaged|married)",
        ),
        (
            "phone",
            rf"{_I}(?:'ve)?\s+(?:just\s+)?(?:got|bought|switched\s+to|have)\s+(?:a|an|the|my)\s+(?:new\s+)?(?P<v>{_PHONES}(?:\s+[\w+]+)?)",
        ),
        (
            "car",
            rf"{_I}\s+(?:just\s+)?(?:bought|got|drive|leased)\s+(?:a|an|the|my)\s+(?:new\s+|used\s+)?(?P<v>{_CARS}(?:\s+[\w-]+)?)",
        ),
        (
            "book",
            rf"(?:\bi(?:'m|\s+am){_NOW}\s+|^)(?:currently\s+)?reading\s+(?!about\b|up\b|a\s+lot\b){_NAME}",
        ),
        ("book", rf"\bi{_NOW}\s+started\s+reading\s+{_NAME}"),
        (
            "course",
            rf"\b(?:i(?:'m|\s+am)|we(?:'re|\s+are)){_NOW}\s+in\s+the\s+(?P<v>[A-Z]\d|[\w-]+)\s+(?:course|class)\b",
        ),
        (
            "instrument",
            rf"\bi(?:'m|\s+am){_NOW}\s+(?:learning|switching\s+from\s+\w+\s+to|taking\s+up)\s+(?:the\s+)?(?P<v>{_INSTRUMENTS})\b",
        ),
        (
            "instrument",
            rf"\b(?:trying\s+to\s+learn|learning|my\s+first)\s+(?:the\s+)?(?P<v>{_INSTRUMENTS})\b",
        ),
        (
            "rent",
            rf"\b(?:(?:my|our|the)\s+rent\s+is|(?:i|we)\s+pay){_NOW}\s+(?:about\s+)?(?P<v>[$€£]?\s?\d[\d.,]*)\s*(?:euros?\s+)?(?:a|per)\s+month",
        ),
        ("rent", rf"\brent\s+(?:is|of){_NOW}\s+(?:about\s+)?{_AMOUNT}"),
        # a flat and what it costs: "a flat in Neukölln, 1,450 warm", "the flat is 900 a month"
        (
            "rent",
            rf"\b(?:flat|apartment|place|room)\b[^.!?]*?\s{_AMOUNT}\s*(?:euros?\s+|eur\s+)?(?:a\s+month|per\s+month|monthly|warm|cold|all\s+in)\b",
        ),
        (
            "salary",
            rf"\bi{_NOW}\s+take\s+home\s+(?:about\s+|around\s+)?(?P<v>[$€£]?\s?\d[\d.,]*\s*k?)",
        ),
        (
            "gym",
            r"\b(?:got|bought|signed\s+up\s+for)\s+an?\s+(?P<v>[A-Z][\w-]*(?:\s+[A-Z][\w-]*)?)\s+membership",
        ),
        (
            "gym",
            rf"\bi{_NOW}\s+(?:joined|switched\s+to|go\s+to|train\s+at)\s+(?:a\s+new\s+gym,?\s+)?(?P<v>[\w\s]*gym[\w\s]*?|[A-Z]\w+\s+(?:Fitness|Gym))\b",
        ),
    )
)

# (attribute, pattern) for a fact that ends an attribute with no successor.
_ENDS: tuple[tuple[str | None, re.Pattern[str]], ...] = tuple(
    (attribute, re.compile(pattern, re.IGNORECASE))
    for attribute, pattern in (
        ("residence", rf"{_I}\s+(?:don't|do\s+not|no\s+longer)\s+live\s+in\s+{_NAME}"),
        (
            "residence",
            rf"{_I}\s+(?:moved|have\s+moved|'ve\s+moved)\s+(?:away\s+)?(?:out\s+of|from)\s+{_NAME}",
        ),
        ("employer", rf"\bi\s+(?:don't|do\s+not|no\s+longer)\s+work\s+(?:at|for)\s+{_NAME}"),
        (
            "employer",
            rf"\bi\s+(?:quit|left|was\s+laid\s+off\s+from|got\s+fired\s+from|resigned\s+from)\s+(?:my\s+job\s+at\s+)?{_NAME}",
        ),
        (
            "partner",
            rf"\b(?:i|we)\s+(?:broke\s+up|split\s+up|separated|divorced)\s+(?:with\s+|from\s+)?(?!\d){_NAME}",
        ),
        (
            "partner",
            rf"^{_NAME}\s+and\s+i\s+(?:have\s+|just\s+)?(?:broke\s+up|split\s+up|separated|divorced)\b",
        ),
        (None, rf"\b(?:my\s+)?(?:{_PET}\s+)?{_NAME}\s+(?:died|passed\s+away|was\s+put\s+down)"),
        ("car", rf"\b(?:i\s+)?sold\s+(?:my|the|our)\s+(?:old\s+)?(?P<v>{_CARS}|car)\b"),
        ("car", r"\bi(?:'m|\s+am)\s+(?:now\s+)?(?P<v>without)\s+a\s+car\b"),
        (
            "gym",
            r"\b(?:i\s+)?cancell?ed\s+(?:my\s+)?(?P<v>[A-Z][\w-]*(?:\s+[A-Z][\w-]*)?)(?:\s+membership)?",
        ),
    )
)

_ARTICLE = re.compile(r"^(?:the|a|an|my|our)\s+", re.IGNORECASE)
_FILLER_WORD = re.compile(r"\b(?:last|this|next|on|in|at|yesterday|today|ago)\b.*$", re.IGNORECASE)
_SPEAKER = re.compile(r"^(?P<name>[^:\n]{1,40}):\s+")
_FIRST_PERSON = re.compile(
    r"\b(?:i|i'm|i've|i'd|i'll|we|we're|we've|my|our|us)\b"
    # a chat's subjectless first person: "Started at Siemens on Monday", "Just moved to Porto"
    r"|^(?:just\s+|finally\s+)?(?:started|moved|joined|got|switched|went|adopted|quit|left|sold"
    r"|reading|cancell?ed|bought|also|treated|being|first\s+(?:day|week|month))\b"
    r"|^\w+\s+is\s+(?:now\s+)?my\b|^\w+\s+and\s+i\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Slot:
    """``holder``'s ``attribute`` is ``value`` (or stops being it, when ``ends``)."""

    holder: str
    attribute: str
    value: str
    ends: bool = False

    @property
    def key(self) -> str:
        """What the fact log indexes a slot by: ``holder|attribute``."""
        return f"{self.holder}|{self.attribute}"

    def same_value(self, other: str) -> bool:
        """Whether ``other`` (a normalized value) names the same value: one starts the other,
        word for word ("porto" and "porto portugal")."""
        if ANY in (self.value, other):
            return True
        a, b = self.value.split(), other.split()
        n = min(len(a), len(b))
        return n > 0 and a[:n] == b[:n]


def _value(raw: str) -> str:
    """Case-folded, the article and a trailing time phrase dropped, at most VALUE_WORDS words."""
    text = _FILLER_WORD.sub("", _ARTICLE.sub("", raw.strip(" .,;:!?'\""))).strip(" .,;:-")
    return " ".join(text.casefold().replace(",", "").split()[:VALUE_WORDS])


ANY = "*"
"""The attribute of an ending that names only the value ("Rex died": it ends the holder's open
slot of any attribute with that value), or the value of one that names only the attribute
("I sold my car": any value)."""


def _attribute(name: str | None, match: re.Match[str]) -> str:
    if name is not None:
        return name
    if match.group("a") is None:
        return ANY
    found = match.group("a").casefold()
    if found in _PETS:
        return _PETS[found]
    if found == "boss":
        return "manager"
    if found in {"girlfriend", "boyfriend", "partner", "wife", "husband"}:
        return "partner"
    if found in {"car", "phone", "gym", "manager"}:
        return found
    return f"favourite {found}"


def slots(text: str) -> list[Slot]:
    """The slots a fact's text sets or ends (the first match per attribute). Only a
    first-person statement sets one; an ending needs no "I" ("Rex died in March")."""
    holder = SELF
    if speaker := _SPEAKER.match(text):
        holder = speaker.group("name").strip().casefold()
        text = text[speaker.end() :]
    first_person = _FIRST_PERSON.search(text) is not None
    found: dict[tuple[str, bool], Slot] = {}
    for ends, patterns in ((False, _SETS), (True, _ENDS)):
        if not (ends or first_person):  # an ending names its value: "Rex died" is enough
            continue
        for name, pattern in patterns:
            for match in pattern.finditer(text):
                attribute = _attribute(name, match)
                value = _value(match.group("v"))
                if ends and value in {attribute, "without"}:  # "sold my car", "without a car"
                    value = ANY
                if value and (attribute, ends) not in found:
                    found[(attribute, ends)] = Slot(holder, attribute, value, ends)
                    break
    return list(found.values())
