"""Readable English text generated from a seed, so no third-party prose ships with the package.

The text trains the embedded models' tokenizer and is the source of benchmark prompts, so it
has to look like ordinary writing to a BPE tokenizer: many topics, inflected words, names,
numbers, dates, quotations and varied punctuation. Output depends only on the seed and
:data:`CORPUS_VERSION` (a ``random.Random`` stream over tuples, no hash-ordered iteration), so
a seed gives the same text on every machine and run.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

#: Bump whenever the output for a given seed changes; cached models built on the corpus key on it.
CORPUS_VERSION = 1


@dataclass(frozen=True)
class Topic:
    """Words that belong together, so a paragraph stays on one subject."""

    name: str
    nouns: tuple[str, ...]
    verbs: tuple[str, ...]
    adjectives: tuple[str, ...]
    people: tuple[str, ...]


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


TOPICS: tuple[Topic, ...] = (
    Topic(
        "astronomy",
        _words(
            "telescope galaxy comet nebula orbit planet moon eclipse observatory asteroid "
            "spectrum meteor constellation satellite horizon crater supernova quasar "
            "atmosphere lens star cluster pulsar"
        ),
        _words("observe measure track photograph detect chart orbit predict record calibrate"),
        _words("distant faint bright elliptical stellar lunar cosmic infrared dim remote"),
        _words("astronomer observer navigator physicist student curator"),
    ),
    Topic(
        "cooking",
        _words(
            "kitchen recipe oven skillet broth dough sauce spice onion garlic pepper "
            "butter flour lemon basil pastry loaf stew bean noodle vinegar honey cheese "
            "tomato ladle"
        ),
        _words("simmer roast bake chop whisk season stir knead taste grill braise serve"),
        _words("savory crisp tender fragrant golden bitter smoky creamy fresh tangy spicy"),
        _words("chef baker cook waiter grocer farmer"),
    ),
    Topic(
        "travel",
        _words(
            "harbor railway ticket luggage passport bridge valley village ferry station "
            "road map journey inn coastline mountain border market museum cathedral "
            "island tunnel airport guidebook"
        ),
        _words("visit cross explore wander reach depart arrive climb sail photograph book"),
        _words("crowded quiet scenic ancient narrow winding coastal busy remote charming"),
        _words("traveler guide pilot conductor tourist driver sailor"),
    ),
    Topic(
        "history",
        _words(
            "empire treaty archive manuscript dynasty revolution parliament castle "
            "battle charter monarch colony chronicle province siege coin monument "
            "reform republic scroll inscription ruin"
        ),
        _words("govern conquer negotiate sign inherit abolish found record restore defend"),
        _words("medieval imperial royal forgotten contested ancient legendary rural fragile"),
        _words("historian archivist scholar king queen general envoy scribe"),
    ),
    Topic(
        "sports",
        _words(
            "stadium match tournament goal referee season league coach team score "
            "championship racket bicycle marathon sprint pitch trophy medal rival "
            "training helmet whistle"
        ),
        _words("win lose train defend score tackle sprint celebrate qualify compete coach"),
        _words("athletic decisive narrow dramatic undefeated injured tired rapid fierce"),
        _words("athlete captain goalkeeper runner coach referee cyclist swimmer"),
    ),
    Topic(
        "music",
        _words(
            "orchestra melody rhythm violin piano symphony chord choir concert album "
            "drum guitar harmony tempo stage rehearsal composer ballad overture "
            "cello trumpet score"
        ),
        _words("compose perform rehearse conduct tune record improvise sing play arrange"),
        _words("melodic loud gentle harmonic acoustic rhythmic haunting joyful solemn"),
        _words("composer pianist violinist singer conductor drummer critic"),
    ),
    Topic(
        "economics",
        _words(
            "market price wage budget inflation loan bank contract export import "
            "tariff investment profit revenue debt currency dividend auction "
            "factory merchant ledger supply demand"
        ),
        _words("invest borrow lend trade export import audit forecast negotiate earn spend"),
        _words("fiscal modest volatile stable profitable costly annual quarterly global"),
        _words("economist banker merchant auditor trader accountant investor clerk"),
    ),
    Topic(
        "weather",
        _words(
            "storm rain wind cloud thunder frost drought flood breeze fog snow hail "
            "forecast temperature humidity pressure season monsoon hurricane rainbow "
            "glacier river meadow forest"
        ),
        _words("rain blow freeze thaw flood drift gather clear shelter forecast warn"),
        _words("humid chilly stormy mild windy gray damp frozen sunny tropical arid"),
        _words("forecaster farmer ranger fisherman shepherd gardener"),
    ),
    Topic(
        "technology",
        _words(
            "computer network server cable battery sensor circuit algorithm database "
            "keyboard screen processor memory protocol software robot antenna signal "
            "printer laptop compiler firmware"
        ),
        _words("compute install debug upgrade connect encrypt compile test deploy restart"),
        _words("digital wireless portable efficient reliable faulty modern automated"),
        _words("engineer programmer technician designer analyst operator"),
    ),
    Topic(
        "medicine",
        _words(
            "hospital clinic patient fever vaccine surgery diagnosis prescription "
            "symptom nurse pharmacy bandage infection therapy heart lung bone muscle "
            "stethoscope ward recovery"
        ),
        _words("diagnose treat heal examine prescribe recover vaccinate operate monitor"),
        _words("chronic acute healthy sterile clinical gentle painful swollen contagious"),
        _words("doctor nurse surgeon pharmacist patient midwife therapist"),
    ),
    Topic(
        "architecture",
        _words(
            "tower arch column roof facade courtyard staircase window balcony beam "
            "foundation brick marble timber dome corridor gallery chimney garden "
            "terrace pavilion"
        ),
        _words("design build restore renovate sketch demolish frame reinforce plaster"),
        _words("gothic sturdy elegant spacious symmetrical ornate crumbling vaulted"),
        _words("architect mason carpenter builder surveyor painter"),
    ),
    Topic(
        "agriculture",
        _words(
            "farm harvest orchard barley wheat barn tractor irrigation soil seed cattle "
            "sheep vineyard fence plough hay pasture greenhouse compost crop well"
        ),
        _words("plant harvest water prune graze plough sow irrigate fertilize gather"),
        _words("fertile dry rocky abundant seasonal organic muddy lush barren"),
        _words("farmer shepherd vintner beekeeper gardener miller"),
    ),
    Topic(
        "sea",
        _words(
            "ship harbor anchor lighthouse tide wave reef sail deck mast captain "
            "voyage compass current island whale net dock cargo shipwreck buoy"
        ),
        _words("sail anchor navigate drift dive steer moor chart rescue haul"),
        _words("salty calm rough deep tidal nautical sandy choppy foggy"),
        _words("captain sailor diver fisherman navigator harbormaster"),
    ),
    Topic(
        "law",
        _words(
            "court judge jury verdict lawyer statute appeal witness evidence contract "
            "trial sentence clause testimony license permit tribunal ruling petition"
        ),
        _words("argue appeal testify rule sentence dismiss review enforce draft settle"),
        _words("legal binding fair unlawful unanimous provisional lengthy public"),
        _words("judge lawyer witness clerk magistrate defendant juror"),
    ),
    Topic(
        "education",
        _words(
            "school lesson teacher library textbook exam lecture campus essay notebook "
            "classroom semester curriculum diploma laboratory seminar chalkboard "
            "homework pupil university"
        ),
        _words("teach learn study explain review grade lecture memorize revise enroll"),
        _words("curious diligent difficult academic thorough patient bright"),
        _words("teacher professor student librarian tutor dean"),
    ),
    Topic(
        "art",
        _words(
            "painting canvas sculpture gallery portrait brush pigment exhibition "
            "sketch mural frame clay studio palette statue landscape mosaic print"
        ),
        _words("paint sculpt sketch exhibit frame carve restore display mix admire"),
        _words("vivid abstract subtle luminous delicate bold muted expressive"),
        _words("painter sculptor curator critic collector apprentice"),
    ),
)

FIRST_NAMES = _words(
    "Ada Alan Amara Anton Beatrix Bruno Carmen Cyrus Dalia Dmitri Elena Emil Farah Felix "
    "Greta Hugo Ingrid Ivan Jonas Kaito Lena Leon Mara Mateo Nadia Nils Olga Omar Priya "
    "Quentin Rosa Rafael Sofia Stefan Tamsin Tobias Uma Victor Wanda Xavier Yara Zoltan "
    "Hannah Marcus Lucia Pedro Astrid Kwame Mei Arjun Chiara Sean"
)
LAST_NAMES = _words(
    "Abernathy Bauer Castillo Delacroix Eriksen Fitzgerald Gallagher Haddad Ishikawa "
    "Jankowski Kovacs Lindqvist Moreau Nakamura Okafor Petrov Quinn Rasmussen Santoro "
    "Takahashi Underwood Varga Whitfield Yilmaz Zimmermann Brennan Costa Dubois Novak "
    "Okonkwo Fernandes Hartley Mendoza Sorensen"
)
PLACE_SYLLABLES = _words(
    "al bar ber by cas dor el fen ford gar ham hol ing kel lan ley lin mar mont mor nor "
    "ost pol ra ren ros sal stad ton vale ven vik wick win york za"
)
MONTHS = _words(
    "January February March April May June July August September October November December"
)
WEEKDAYS = _words("Monday Tuesday Wednesday Thursday Friday Saturday Sunday")
CURRENCIES = ("$", "£", "€")

ADVERBS = _words(
    "quickly slowly carefully quietly suddenly eventually rarely often gradually "
    "reluctantly proudly barely nearly finally patiently openly briefly"
)
TIME_PHRASES = (
    "at dawn",
    "by midday",
    "late in the evening",
    "after the holidays",
    "before the first snow",
    "during the long summer",
    "within a fortnight",
    "the following spring",
    "for most of the decade",
    "in the small hours",
)
CONNECTIVES = (
    "However",
    "Meanwhile",
    "Even so",
    "In the end",
    "As a result",
    "For a while",
    "At first",
    "Nevertheless",
    "Later",
    "Surprisingly",
    "Of course",
    "In practice",
)
SPEECH_VERBS = _words("said asked replied noted admitted insisted wrote remarked whispered")
QUANTIFIERS = _words("several many few countless dozens_of hundreds_of some two three")

_IRREGULAR_PAST = {
    "build": "built",
    "buy": "bought",
    "dive": "dived",
    "draw": "drew",
    "find": "found",
    "freeze": "froze",
    "grind": "ground",
    "lend": "lent",
    "lose": "lost",
    "spend": "spent",
    "steer": "steered",
    "sing": "sang",
    "teach": "taught",
    "win": "won",
    "blow": "blew",
    "sow": "sowed",
    "learn": "learned",
    "rain": "rained",
}
_IRREGULAR_PLURAL = {
    "sheep": "sheep",
    "cattle": "cattle",
    "hay": "hay",
    "evidence": "evidence",
    "luggage": "luggage",
    "homework": "homework",
    "software": "software",
    "firmware": "firmware",
    "memory": "memories",
    "cargo": "cargoes",
    "tomato": "tomatoes",
    "hero": "heroes",
    "shelf": "shelves",
    "loaf": "loaves",
    "wharf": "wharves",
    "fish": "fish",
    "chef": "chefs",
    "roof": "roofs",
}
_VOWELS = frozenset("aeiou")


def plural(noun: str) -> str:
    if noun in _IRREGULAR_PLURAL:
        return _IRREGULAR_PLURAL[noun]
    if noun.endswith("y") and noun[-2] not in _VOWELS:
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def past_tense(verb: str) -> str:
    if verb in _IRREGULAR_PAST:
        return _IRREGULAR_PAST[verb]
    if verb.endswith("e"):
        return verb + "d"
    if verb.endswith("y") and verb[-2] not in _VOWELS:
        return verb[:-1] + "ied"
    if _doubles_final_consonant(verb):
        return verb + verb[-1] + "ed"
    return verb + "ed"


def third_person(verb: str) -> str:
    if verb.endswith("y") and verb[-2] not in _VOWELS:
        return verb[:-1] + "ies"
    if verb.endswith(("s", "x", "z", "ch", "sh", "o")):
        return verb + "es"
    return verb + "s"


def gerund(verb: str) -> str:
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith(("ee", "ye", "oe")):
        return verb[:-1] + "ing"
    if _doubles_final_consonant(verb):
        return verb + verb[-1] + "ing"
    return verb + "ing"


def _doubles_final_consonant(verb: str) -> bool:
    """Short consonant-vowel-consonant verbs (``stop``, ``win``) double the last letter."""
    return (
        len(verb) <= 4
        and len(verb) >= 3
        and verb[-1] not in _VOWELS | {"w", "x", "y"}
        and verb[-2] in _VOWELS
        and verb[-3] not in _VOWELS
    )


def _article(word: str) -> str:
    return "an" if word[0].lower() in _VOWELS else "a"


class _Slots:
    """Fills ``{slot}`` fields of a template; every field occurrence draws afresh."""

    def __init__(self, rng: random.Random, topic: Topic) -> None:
        self._rng = rng
        self._topic = topic
        self._fillers: dict[str, Callable[[], str]] = {
            "noun": lambda: self._pick(topic.nouns),
            "nouns": lambda: plural(self._pick(topic.nouns)),
            "a_noun": self._a_noun,
            "adj": lambda: self._pick(topic.adjectives),
            "a_adj": self._a_adj,
            "verb": lambda: self._pick(topic.verbs),
            "verbs": lambda: third_person(self._pick(topic.verbs)),
            "verbed": lambda: past_tense(self._pick(topic.verbs)),
            "verbing": lambda: gerund(self._pick(topic.verbs)),
            "role": lambda: self._pick(topic.people),
            "roles": lambda: plural(self._pick(topic.people)),
            "name": self._name,
            "first": lambda: self._pick(FIRST_NAMES),
            "place": self._place,
            "adverb": lambda: self._pick(ADVERBS),
            "when": lambda: self._pick(TIME_PHRASES),
            "connective": lambda: self._pick(CONNECTIVES),
            "said": lambda: self._pick(SPEECH_VERBS),
            "many": lambda: self._pick(QUANTIFIERS).replace("_", " "),
            "count": self._count,
            "small": lambda: str(self._rng.randint(2, 12)),
            "year": lambda: str(self._rng.randint(1450, 2030)),
            "date": self._date,
            "day": lambda: self._pick(WEEKDAYS),
            "clock": self._clock,
            "percent": self._percent,
            "money": self._money,
            "decimal": lambda: f"{self._rng.uniform(0.1, 99.9):.{self._rng.randint(1, 3)}f}",
            "ordinal": self._ordinal,
            "range": self._range,
        }

    def __getitem__(self, key: str) -> str:
        try:
            return self._fillers[key]()
        except KeyError:
            raise KeyError(f"template field {{{key}}} is not a known slot") from None

    def _pick(self, options: tuple[str, ...]) -> str:
        return options[self._rng.randrange(len(options))]

    def _a_noun(self) -> str:
        noun = self._pick(self._topic.nouns)
        return f"{_article(noun)} {noun}"

    def _a_adj(self) -> str:
        adjective = self._pick(self._topic.adjectives)
        return f"{_article(adjective)} {adjective}"

    def _name(self) -> str:
        first, last = self._pick(FIRST_NAMES), self._pick(LAST_NAMES)
        style = self._rng.random()
        if style < 0.15:
            return f"Dr. {last}"
        if style < 0.25:
            return f"{first[0]}. {last}"
        if style < 0.35:
            return f"{first} {last}-{self._pick(LAST_NAMES)}"
        return f"{first} {last}"

    def _place(self) -> str:
        """Made-up town names give the tokenizer sub-word pieces, as real proper nouns do."""
        parts = [self._pick(PLACE_SYLLABLES) for _ in range(self._rng.randint(2, 3))]
        name = "".join(parts).capitalize()
        suffix = self._rng.random()
        if suffix < 0.1:
            return f"Port {name}"
        if suffix < 0.2:
            return f"{name} Falls"
        if suffix < 0.27:
            return f"St. {name}"
        return name

    def _count(self) -> str:
        value = int(10 ** self._rng.uniform(1, 6.5))
        return f"{value:,}" if self._rng.random() < 0.7 else str(value)

    def _date(self) -> str:
        month = self._pick(MONTHS)
        day = self._rng.randint(1, 28)
        year = self._rng.randint(1700, 2030)
        if self._rng.random() < 0.5:
            return f"{day} {month} {year}"
        return f"{month} {day}, {year}"

    def _clock(self) -> str:
        if self._rng.random() < 0.5:
            return f"{self._rng.randint(0, 23):02d}:{self._rng.randrange(0, 60, 5):02d}"
        period = self._pick(("a.m.", "p.m."))
        return f"{self._rng.randint(1, 12)}:{self._rng.randrange(0, 60, 5):02d} {period}"

    def _percent(self) -> str:
        if self._rng.random() < 0.5:
            return f"{self._rng.randint(1, 99)}%"
        return f"{self._rng.uniform(0.1, 99.9):.1f} percent"

    def _money(self) -> str:
        amount = self._rng.uniform(1, 250_000)
        symbol = self._pick(CURRENCIES)
        if amount > 1000:
            return f"{symbol}{int(amount):,}"
        return f"{symbol}{amount:.2f}"

    def _ordinal(self) -> str:
        value = self._rng.randint(1, 40)
        if 10 <= value % 100 <= 20:
            suffix = "th"
        else:
            suffix = {1: "st", 2: "nd", 3: "rd"}.get(value % 10, "th")
        return f"{value}{suffix}"

    def _range(self) -> str:
        low = self._rng.randint(1, 90)
        return f"{low}-{low + self._rng.randint(1, 40)}"


SENTENCE_TEMPLATES: tuple[str, ...] = (
    "The {adj} {noun} in {place} was {verbed} by {a_adj} {role} {when}.",
    "{name} {verbed} the {noun} {adverb}, and the {roles} {verbed} {many} {nouns}.",
    "{connective}, the {roles} of {place} {verbed} {count} {nouns} between {year} and {year}.",
    '"We {verb} the {noun} every {day}," {said} {name}, "but nobody {verbs} the {noun}."',
    "Why would {a_adj} {role} {verb} the {noun} at {clock}?",
    "On {date}, {name} {verbed} {a_noun} near {place}; the cost was {money}.",
    "Roughly {percent} of the {nouns} were {adj}, according to the {ordinal} report.",
    "{connective}, {name} kept {verbing} the {noun} (about {decimal} per {noun}) {when}.",
    "It's {adj} work: {verbing} {nouns}, {verbing} {nouns} and {verbing} the {noun}.",
    "Few {roles} in {place} had ever {verbed} {a_adj} {noun} like that!",
    "The {noun} and the {noun} are {adj}, yet the {noun} is {adj} — at least in {place}.",
    "{name} didn't {verb} the {nouns}; instead, {name} {verbed} {small} {adj} {nouns}.",
    "By the {ordinal} {noun}, the {roles} had {verbed} nearly {count} {nouns} in {place}.",
    "Pages {range} of the {noun} log describe how {name} {verbed} the {noun} {adverb}.",
    '"Is the {noun} {adj}?" {said} {name}. "It isn\'t," came the {adj} answer.',
    "{connective}, everyone agreed that the {noun} was too {adj} to {verb} {when}.",
    "In {year}, the {adj} {noun} of {place} cost {money} and drew {count} visitors.",
    "Each {role} {verbs} the {noun} differently, which {name} {verbed} {when}.",
    "{a_noun}, two {nouns}, and {a_adj} {noun}: that's what {name} {verbed} at {clock}.",
    "The {role} from {place} {verbed} that {percent} of all {nouns} {verb} poorly.",
    "We {verbed} the {nouns} {adverb}, then {verbed} them again on {date}.",
    "Although the {noun} was {adj}, the {roles} {verbed} it {adverb} {when}.",
    "Nobody in {place} could {verb} the {noun} faster than {name}, who {verbed} {small} of them.",
    "{name}'s {adj} {noun} — {verbed} in {year} — still stands near {place}.",
    "How many {nouns} can a {role} {verb} in {small} days?",
    "The {ordinal} {noun} of the season was {adj}; the {ordinal} was even more {adj}.",
    "At {clock} on a {day}, {small} {roles} {verbed} the {noun} at {place}.",
    "{connective}, the {noun} cost {money}, up {percent} since {year}.",
)

PARAGRAPH_OPENERS: tuple[str, ...] = (
    "A note on the {noun} of {place}.",
    "{name} remembers {date} well.",
    "Chapter {small}: the {adj} {noun}.",
    "From the journal of {name}, {date}.",
    "The {roles} of {place}, {year}.",
)

_FIELD_RE = re.compile(r"\{(\w+)\}")


def _split_template(template: str) -> tuple[str, ...]:
    """Literal text at even positions, slot names at odd ones: parsed once, rendered often."""
    return tuple(_FIELD_RE.split(template))


_SENTENCE_PARTS = tuple(_split_template(template) for template in SENTENCE_TEMPLATES)
_OPENER_PARTS = tuple(_split_template(template) for template in PARAGRAPH_OPENERS)


def _capitalize_first(sentence: str) -> str:
    for index, char in enumerate(sentence):
        if char.isalpha():
            return sentence[:index] + char.upper() + sentence[index + 1 :]
    return sentence


def _render(parts: tuple[str, ...], slots: _Slots) -> str:
    pieces = [slots[part] if index % 2 else part for index, part in enumerate(parts)]
    return _capitalize_first("".join(pieces))


def iter_paragraphs(seed: int) -> Iterator[str]:
    """Endless paragraphs for ``seed``, each on one topic with 3-8 sentences."""
    rng = random.Random(seed)
    while True:
        topic = TOPICS[rng.randrange(len(TOPICS))]
        slots = _Slots(rng, topic)
        sentences = []
        if rng.random() < 0.2:
            sentences.append(_render(_OPENER_PARTS[rng.randrange(len(_OPENER_PARTS))], slots))
        for _ in range(rng.randint(3, 8)):
            sentences.append(_render(_SENTENCE_PARTS[rng.randrange(len(_SENTENCE_PARTS))], slots))
        yield " ".join(sentences)


def generate_corpus(n_chars: int, seed: int = 0) -> str:
    """Exactly ``n_chars`` characters of paragraphs separated by blank lines."""
    if isinstance(n_chars, bool) or not isinstance(n_chars, int) or n_chars < 0:
        raise ValueError(f"n_chars must be a non-negative int, got {n_chars!r}")
    pieces: list[str] = []
    total = 0
    for paragraph in iter_paragraphs(seed):
        if total >= n_chars:
            break
        pieces.append(paragraph)
        total += len(paragraph) + 2
    return "\n\n".join(pieces)[:n_chars]
