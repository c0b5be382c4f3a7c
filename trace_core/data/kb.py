"""A seeded knowledge base of fictional entities, its passage corpus and 2–4-hop questions over it.

Entities are people, companies, cities, countries and universities with made-up names, a few
value attributes (years, populations, industries, ...) and functional relations between them
(a person's employer, a company's headquarters, a city's country, a country's capital, ...).
Each entity's facts are grouped, and each group is one passage (a person has a "bio" and a
"career" passage, a company a "profile" and a "leadership" passage, the rest one "overview").

A question with ``h`` hops follows ``h`` relations from a named start entity, e.g. (3 hops)
"In which country does the city where the company that employs Ilvar Dunmoth is headquartered
lie?". Answering needs the passage of every entity on the path before the answer, and those are
``metadata["supporting_passages"]``; ``metadata["path"]`` spells out each hop (entity, relation,
passage), which is what a scripted search expert follows. All relations are functions, so every
question has exactly one answer, and no entity appears twice on a path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trace_core.data.hashing import HashRng
from trace_core.data.schema import Example, Passage

SOURCE = "trace-kbqa"
KINDS = ("person", "company", "city", "country", "university")

# Entity-valued relations: kind -> relation -> target kind.
RELATIONS: dict[str, dict[str, str]] = {
    "person": {"employer": "company", "birthplace": "city", "alma_mater": "university"},
    "company": {"headquarters": "city", "founder": "person", "ceo": "person"},
    "city": {"country": "country", "mayor": "person"},
    "university": {"location": "city"},
    "country": {"capital": "city"},
}
# Value attributes: kind -> attribute names.
VALUES: dict[str, tuple[str, ...]] = {
    "person": ("birth_year", "profession"),
    "company": ("founded", "industry"),
    "city": ("population",),
    "university": ("founded",),
    "country": ("currency",),
}
# The passage (fact group) that states each fact; anything not listed is in "overview".
GROUPS: dict[tuple[str, str], str] = {
    ("person", "birth_year"): "bio",
    ("person", "birthplace"): "bio",
    ("person", "alma_mater"): "bio",
    ("person", "profession"): "career",
    ("person", "employer"): "career",
    ("company", "founded"): "profile",
    ("company", "industry"): "profile",
    ("company", "headquarters"): "profile",
    ("company", "founder"): "leadership",
    ("company", "ceo"): "leadership",
}
# A noun phrase for "the target of relation r from x", and the question asking for it.
PHRASES: dict[tuple[str, str], str] = {
    ("person", "employer"): "the company that employs {x}",
    ("person", "birthplace"): "the city where {x} was born",
    ("person", "alma_mater"): "the university that {x} attended",
    ("company", "headquarters"): "the city where {x} is headquartered",
    ("company", "founder"): "the founder of {x}",
    ("company", "ceo"): "the chief executive of {x}",
    ("city", "country"): "the country in which {x} lies",
    ("city", "mayor"): "the mayor of {x}",
    ("university", "location"): "the city where {x} is located",
    ("country", "capital"): "the capital of {x}",
}
QUESTIONS: dict[tuple[str, str], str] = {
    ("person", "employer"): "Which company employs {x}?",
    ("person", "birthplace"): "In which city was {x} born?",
    ("person", "alma_mater"): "Which university did {x} attend?",
    ("person", "birth_year"): "In what year was {x} born?",
    ("person", "profession"): "What is the profession of {x}?",
    ("company", "headquarters"): "In which city is {x} headquartered?",
    ("company", "founder"): "Who founded {x}?",
    ("company", "ceo"): "Who is the chief executive of {x}?",
    ("company", "founded"): "In what year was {x} founded?",
    ("company", "industry"): "In which industry does {x} operate?",
    ("city", "country"): "In which country does {x} lie?",
    ("city", "mayor"): "Who is the mayor of {x}?",
    ("city", "population"): "What is the population of {x}?",
    ("university", "location"): "In which city is {x} located?",
    ("university", "founded"): "In what year was {x} founded?",
    ("country", "capital"): "What is the capital of {x}?",
    ("country", "currency"): "What currency is used in {x}?",
}

_ONSETS = (
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "th",
    "v",
    "z",
    "h",
    "j",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou", "ia")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m", "k", "nd")
_PROFESSIONS = (
    "cartographer",
    "engineer",
    "economist",
    "architect",
    "chemist",
    "lawyer",
    "journalist",
    "composer",
    "surgeon",
    "geologist",
    "translator",
    "historian",
)
_INDUSTRIES = (
    "shipping",
    "textiles",
    "software",
    "mining",
    "aviation",
    "pharmaceuticals",
    "publishing",
    "agriculture",
    "robotics",
    "banking",
)
_COMPANY_SUFFIXES = ("Labs", "Industries", "Holdings", "Works", "Systems", "Foundry", "Group", "Dynamics")
_CURRENCY_UNITS = ("crown", "mark", "florin", "thaler", "ducat", "shilling")


@dataclass(frozen=True)
class KBConfig:
    """Sizes and seed of the knowledge base and of its questions."""

    n_people: int = 60
    n_companies: int = 24
    n_cities: int = 20
    n_countries: int = 6
    n_universities: int = 10
    n_train: int = 400  # training questions
    n_test: int = 100  # held-out questions (no text repeats a training question)
    min_hops: int = 2
    max_hops: int = 4
    seed: int = 0


@dataclass
class Entity:
    id: str  # "<kind>-<index:03d>"
    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)  # values, and entity ids for relations


class _Names:
    """Unique pronounceable made-up words."""

    def __init__(self, rng: HashRng):
        self.rng, self.used = rng, set()

    def word(self, syllables: int) -> str:
        while True:
            text = "".join(
                self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                for _ in range(syllables)
            )
            if text not in self.used and 4 <= len(text) <= 10:
                self.used.add(text)
                return text.capitalize()


def build_kb(config: KBConfig = KBConfig()) -> dict[str, Entity]:
    """All entities by id, in creation order."""
    if (
        min(config.n_people, config.n_companies, config.n_cities, config.n_countries, config.n_universities)
        < 1
    ):
        raise ValueError(f"every entity count must be >= 1, got {config}")
    if config.n_cities < config.n_countries or config.n_people < max(config.n_cities, 2):
        raise ValueError(
            "need n_cities >= n_countries and n_people >= max(n_cities, 2) (distinct mayors, "
            f"founder != ceo), got {config}"
        )
    rng = HashRng(f"{config.seed}/kb")
    names = _Names(rng)
    kb: dict[str, Entity] = {}

    def add(kind: str, index: int, name: str) -> Entity:
        entity = Entity(f"{kind}-{index:03d}", kind, name)
        kb[entity.id] = entity
        return entity

    countries = [add("country", i, names.word(2)) for i in range(config.n_countries)]
    cities = [add("city", i, names.word(2)) for i in range(config.n_cities)]
    universities = [
        add(
            "university",
            i,
            rng.choice(("{} University", "University of {}", "{} Institute")).format(names.word(2)),
        )
        for i in range(config.n_universities)
    ]
    companies = [
        add("company", i, f"{names.word(2)} {rng.choice(_COMPANY_SUFFIXES)}")
        for i in range(config.n_companies)
    ]
    people = [add("person", i, f"{names.word(2)} {names.word(2)}") for i in range(config.n_people)]

    for i, city in enumerate(cities):  # the first cities give every country at least one
        country = countries[i] if i < len(countries) else rng.choice(countries)
        city.attrs["country"] = country.id
        city.attrs["population"] = rng.randint(20_000, 3_000_000)
    for country in countries:
        country.attrs["capital"] = rng.choice([c.id for c in cities if c.attrs["country"] == country.id])
        country.attrs["currency"] = f"{names.word(1).lower()} {rng.choice(_CURRENCY_UNITS)}"
    for uni in universities:
        uni.attrs["location"] = rng.choice(cities).id
        uni.attrs["founded"] = rng.randint(1700, 1990)
    for company in companies:
        founder, ceo = rng.sample(people, 2)
        company.attrs.update(
            headquarters=rng.choice(cities).id,
            founded=rng.randint(1850, 2015),
            industry=rng.choice(_INDUSTRIES),
            founder=founder.id,
            ceo=ceo.id,
        )
    for person in people:
        person.attrs.update(
            birth_year=rng.randint(1930, 1995),
            birthplace=rng.choice(cities).id,
            alma_mater=rng.choice(universities).id,
            profession=rng.choice(_PROFESSIONS),
            employer=rng.choice(companies).id,
        )
    for city, mayor in zip(cities, rng.sample(people, len(cities)), strict=True):
        city.attrs["mayor"] = mayor.id
    return kb


def group_of(kind: str, attr: str) -> str:
    return GROUPS.get((kind, attr), "overview")


def passage_id(entity: Entity, attr: str) -> str:
    return f"{entity.id}-{group_of(entity.kind, attr)}"


def _passage_text(kb: dict[str, Entity], e: Entity, group: str) -> str:
    a = e.attrs

    def name(attr: str) -> str:
        return kb[a[attr]].name

    key = (e.kind, group)
    if key == ("person", "bio"):
        return (
            f"{e.name} was born in {a['birth_year']} in {name('birthplace')}. "
            f"{e.name} studied at {name('alma_mater')}."
        )
    if key == ("person", "career"):
        return f"{e.name} works as a {a['profession']} at {name('employer')}."
    if key == ("company", "profile"):
        return (
            f"{e.name} is a {a['industry']} company founded in {a['founded']}. "
            f"Its headquarters are in {name('headquarters')}."
        )
    if key == ("company", "leadership"):
        return f"{e.name} was founded by {name('founder')}. Its chief executive is {name('ceo')}."
    if key == ("city", "overview"):
        return (
            f"{e.name} is a city in {name('country')} with a population of {a['population']:,}. "
            f"Its mayor is {name('mayor')}."
        )
    if key == ("university", "overview"):
        return f"{e.name} is a university in {name('location')}, founded in {a['founded']}."
    if key == ("country", "overview"):
        return (
            f"{e.name} is a country whose capital is {name('capital')}. Its currency is the {a['currency']}."
        )
    raise ValueError(f"no passage template for {key}")


def corpus(kb: dict[str, Entity]) -> list[Passage]:
    """One passage per (entity, fact group), sorted by id."""
    out = {}
    for e in kb.values():
        for attr in (*RELATIONS[e.kind], *VALUES[e.kind]):
            pid = passage_id(e, attr)
            if pid not in out:
                out[pid] = Passage(pid, e.name, _passage_text(kb, e, group_of(e.kind, attr)))
    return [out[k] for k in sorted(out)]


def _walk(kb: dict[str, Entity], rng: HashRng, hops: int) -> list[tuple[Entity, str]] | None:
    """``hops`` (entity, attribute) steps from a random start; None on a dead end."""
    entity = rng.choice(list(kb.values()))
    visited, steps = {entity.id}, []
    for _ in range(hops - 1):
        options = [r for r in RELATIONS[entity.kind] if entity.attrs[r] not in visited]
        if not options:
            return None
        rel = rng.choice(options)
        steps.append((entity, rel))
        entity = kb[entity.attrs[rel]]
        visited.add(entity.id)
    finals = list(VALUES[entity.kind]) + [r for r in RELATIONS[entity.kind] if entity.attrs[r] not in visited]
    steps.append((entity, rng.choice(finals)))
    return steps


def _answers(kb: dict[str, Entity], entity: Entity, attr: str) -> list[str]:
    value = entity.attrs[attr]
    if attr in RELATIONS[entity.kind]:
        return [kb[value].name]
    if isinstance(value, int) and value >= 1000 and attr == "population":
        return [str(value), f"{value:,}"]
    return [str(value)]


def question(kb: dict[str, Entity], steps: list[tuple[Entity, str]], split: str, index: int) -> Example:
    phrase = steps[0][0].name
    for entity, rel in steps[:-1]:
        phrase = PHRASES[(entity.kind, rel)].format(x=phrase)
    last, attr = steps[-1]
    text = QUESTIONS[(last.kind, attr)].format(x=phrase)
    text = text[0].upper() + text[1:]
    path = [
        {"entity": e.name, "entity_id": e.id, "relation": r, "passage": passage_id(e, r)} for e, r in steps
    ]
    target = last.attrs[attr] if attr in RELATIONS[last.kind] else None
    metadata = {
        "hops": len(steps),
        "supporting_passages": [p["passage"] for p in path],
        "path": path,
        "answer_entity_id": target,
    }
    return Example(
        id=f"kbqa-{split}-{index:05d}",
        task="qa",
        source=SOURCE,
        split=split,
        prompt=text,
        answers=_answers(kb, last, attr),
        choices=[],
        metadata=metadata,
    )


def generate_questions(
    kb: dict[str, Entity], split: str, n: int, config: KBConfig, taken: set[str]
) -> list[Example]:
    """``n`` questions, hop counts cycling through [min_hops, max_hops]; texts in ``taken`` are redrawn."""
    if not 1 <= config.min_hops <= config.max_hops:
        raise ValueError(f"need 1 <= min_hops <= max_hops, got {config.min_hops}, {config.max_hops}")
    span = config.max_hops - config.min_hops + 1
    out = []
    for i in range(n):
        hops = config.min_hops + i % span
        for attempt in range(1000):
            steps = _walk(kb, HashRng(f"{config.seed}/kbqa/{split}/{i}/{attempt}"), hops)
            if steps is None:
                continue
            example = question(kb, steps, split, i)
            if example.prompt not in taken:
                break
        else:
            raise ValueError(f"could not draw {n} distinct {split} questions from this KB; enlarge it")
        taken.add(example.prompt)
        out.append(example)
    return out


def generate(
    config: KBConfig = KBConfig(),
) -> tuple[dict[str, Entity], list[Passage], dict[str, list[Example]]]:
    """The KB, its corpus and the train/test questions."""
    kb = build_kb(config)
    taken: set[str] = set()
    train = generate_questions(kb, "train", config.n_train, config, taken)
    test = generate_questions(kb, "test", config.n_test, config, taken)
    return kb, corpus(kb), {"train": train, "test": test}


def kb_record(kb: dict[str, Entity]) -> dict[str, Any]:
    """The KB as one JSON-ready object (entities sorted by id)."""
    return {
        "entities": [
            {"id": e.id, "kind": e.kind, "name": e.name, "attrs": e.attrs}
            for e in sorted(kb.values(), key=lambda e: e.id)
        ]
    }
