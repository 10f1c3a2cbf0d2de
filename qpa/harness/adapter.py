"""The Scenario Adapter: which tool docs and Skills a planner sees for this task, within a budget.

The planner is not bound to a fixed tool list: each episode offers the tools available now. The
adapter ranks those tools and the Skills of their apps by lexical relevance to the instruction
(BM25 over stemmed words of names, descriptions, parameters and app descriptions; no ML), and
renders a prompt section that fits `token_budget`. Spending order, each step greedy:

1. every exposed tool as *name(params) + short description* -- never dropped for budget (a
   scenario's tool must stay callable; if even this exceeds the budget, `over_budget` is set);
2. relevant Skills (score > 0) of the apps whose tools are exposed, most relevant first;
3. full argument schemas of the relevant tools (score > 0), most relevant first;
4. the other Skills of those apps, then the other tools' full schemas.

Skills come before schemas because they are denser in what cannot be recovered from: a missing
schema detail surfaces as an `invalid_arguments` error the planner can correct, a missing
procedure ("schedule, do not send now") fails silently. Relevance of an app (its description,
tools and Skills together) lifts all its tools and Skills, so a task about texting ranks every
messaging tool above an unrelated app's.

Whatever did not fit is recorded (`schema_truncated`, `skills_truncated`); `max_tools` is an
explicit cap on how many tools are exposed (the rest are recorded as `tools_dropped`);
`drop_skills` withholds Skills on purpose, to inject Harness faults for tests and diagnosis
(recorded as `skills_withheld`). `Exposure.annotations()` is what the agent loop writes into the
Step annotations, so every trajectory shows which Skills and tools its planner was shown.

Token counts come from `estimate_tokens`, a cheap deterministic estimator; pass `count_tokens`
(e.g. `tokenizer_counter(tokenizer)` for a real tokenizer) to swap it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from qpa.contract import ToolSpec
from qpa.harness.skills import Skill, SkillLibrary
from qpa.harness.toolmemo import ToolObjectMemo

__all__ = [
    "ADAPTER_VERSION",
    "BM25",
    "ExposedSkill",
    "Exposure",
    "ScenarioAdapter",
    "TokenCounter",
    "estimate_tokens",
    "stem",
    "terms",
    "tokenizer_counter",
]

ADAPTER_VERSION = "bm25-1"
TokenCounter = Callable[[str], int]

# --------------------------------------------------------------------------- lexical relevance

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORD_TEXT = """a an and are as at be been but by can could do does for from had has have he her
his how i if im in into is it its me my myself of on or our please she so than that the their them
then there these they this to up us was we were what when where which who will with would you your
just also some any all get"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_KEEP_S = ("ss", "us", "is")


def stem(word: str) -> str:
    """A tiny suffix stripper (plural, -ing, -ed, -ment, final e): `messages`/`message` -> `messag`,
    `scheduled`/`schedule` -> `schedul`, `payment`/`pay` -> `pay`. Deterministic, no lexicon."""
    w = word
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 3 and w.endswith("s") and not w.endswith(_KEEP_S):
        w = w[:-1]
    for suffix in ("ing", "ed", "ment"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "aeioulsz":
                w = w[:-1]  # running -> run, preferred -> prefer
            break
    if len(w) > 4 and w.endswith("e"):
        w = w[:-1]
    return w


def terms(text: str) -> list[str]:
    """Lower-cased, stemmed words without stopwords; `snake_case` names split into words."""
    return list(_terms(text))


@lru_cache(maxsize=32768)
def _terms(text: str) -> tuple[str, ...]:
    # Tool, app and Skill texts repeat across episodes: memoised, they cost nothing after once.
    return tuple(
        stem(w)
        for w in _WORD.findall(text.lower())
        if (len(w) > 1 or w.isdigit()) and w not in _STOPWORDS
    )


class BM25:
    """Okapi BM25 over a small in-memory corpus of term lists (built per call; corpora are tiny)."""

    def __init__(self, docs: Sequence[Sequence[str]], *, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        self.docs = [Counter(d) for d in docs]
        self.lengths = [len(d) for d in docs]
        self.avg = (sum(self.lengths) / len(self.lengths)) if self.lengths else 0.0
        df: Counter[str] = Counter()
        for doc in self.docs:
            df.update(doc.keys())
        n = len(self.docs)
        self.idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        # per term: (document, that document's share of the score per unit of idf), in document
        # order; a document's score adds its terms' shares in the query's order
        norms = [
            self.k1 * (1 - self.b + self.b * (length / self.avg if self.avg else 0.0))
            for length in self.lengths
        ]
        self._postings: dict[str, list[tuple[int, int, float]]] = {}
        for i, (doc, norm) in enumerate(zip(self.docs, norms, strict=True)):
            for t, tf in doc.items():
                if tf:
                    self._postings.setdefault(t, []).append((i, tf, norm))

    def scores(self, query: Iterable[str]) -> list[float]:
        out = [0.0] * len(self.docs)
        k1 = self.k1
        for t in set(query):
            postings = self._postings.get(t)
            if postings is None:
                continue
            idf = self.idf[t]
            for i, tf, norm in postings:
                out[i] += idf * tf * (k1 + 1) / (tf + norm)
        return out


# --------------------------------------------------------------------------- token counting

_TOKEN = re.compile(r"[A-Za-z]+|\d|[^\sA-Za-z\d]")


def estimate_tokens(text: str) -> int:
    """A cheap, deterministic token estimate: letter runs count one per started 8 letters, each
    digit and each punctuation mark one (close to BPE counts for English prose and JSON)."""
    total = 0
    for piece in _TOKEN.findall(text):
        total += (len(piece) + 7) // 8 if piece[0].isalpha() else 1
    return total


def tokenizer_counter(tokenizer: Any) -> TokenCounter:
    """A `TokenCounter` from any tokenizer with `encode(text)` (Hugging Face, tiktoken...)."""

    def count(text: str) -> int:
        try:
            ids = tokenizer.encode(text, add_special_tokens=False)
        except TypeError:
            ids = tokenizer.encode(text)
        return len(ids)

    return count


# --------------------------------------------------------------------------- exposure


class ExposedSkill(BaseModel):
    """A Skill the adapter put into the prompt, with its relevance score."""

    model_config = ConfigDict(extra="forbid")

    app: str
    name: str
    text: str
    score: float = 0.0

    @property
    def id(self) -> str:
        return f"{self.app}.{self.name}"


class Exposure(BaseModel):
    """What the planner was shown for one task: tools, Skills and the rendered prompt section."""

    model_config = ConfigDict(extra="forbid")

    version: str
    budget: int
    tools: list[ToolSpec] = Field(default_factory=list)
    tool_scores: dict[str, float] = Field(default_factory=dict)
    schemas: list[str] = Field(default_factory=list)
    schema_truncated: list[str] = Field(default_factory=list)
    tools_dropped: list[str] = Field(default_factory=list)
    skills: list[ExposedSkill] = Field(default_factory=list)
    skills_truncated: list[str] = Field(default_factory=list)
    skills_withheld: list[str] = Field(default_factory=list)
    text: str = ""
    tokens: int = 0
    over_budget: bool = False

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    @property
    def skill_ids(self) -> list[str]:
        return [s.id for s in self.skills]

    def annotations(self) -> dict[str, Any]:
        """The Step annotations recording this exposure (truncations always; faults if any)."""
        notes: dict[str, Any] = {
            "skills_exposed": self.skill_ids,
            "tools_exposed": self.tool_names,
            "adapter_tokens": self.tokens,
            "adapter_budget": self.budget,
            "adapter_version": self.version,
            "tools_schema_truncated": list(self.schema_truncated),
            "skills_truncated": list(self.skills_truncated),
        }
        if self.tools_dropped:
            notes["tools_dropped"] = list(self.tools_dropped)
        if self.skills_withheld:
            notes["skills_withheld"] = list(self.skills_withheld)
        if self.over_budget:
            notes["adapter_over_budget"] = True
        return notes


# --------------------------------------------------------------------------- the adapter

TOOLS_HEADER = "## Tools available now"
SKILLS_HEADER = "## Skills (app procedures: follow them when using these apps)"
SHORT_DESCRIPTION_CHARS = 120
APP_WEIGHT = 0.5  # how much an app's relevance lifts its tools and Skills


def _short(description: str) -> str:
    first = re.split(r"(?<=[.!?])\s", description.strip(), maxsplit=1)[0]
    if len(first) > SHORT_DESCRIPTION_CHARS:
        first = first[: SHORT_DESCRIPTION_CHARS - 1].rstrip() + "…"
    return first


def _param_names(spec: ToolSpec) -> list[str]:
    props = spec.parameters.get("properties", {}) or {}
    required = set(spec.parameters.get("required", []) or [])
    return [name if name in required else f"{name}?" for name in props]


def _params(spec: ToolSpec) -> bytes:
    """A tool's argument schema as canonical JSON bytes (part of its cache keys)."""
    return orjson.dumps(spec.parameters, option=orjson.OPT_SORT_KEYS)


def render_compact(spec: ToolSpec) -> str:
    """One line: `- name(arg, opt?) [write]: short description.`"""
    effect = "" if spec.side_effect == "read" else f" [{spec.side_effect}]"
    return f"- {spec.name}({', '.join(_param_names(spec))}){effect}: {_short(spec.description)}"


def render_full(spec: ToolSpec) -> str:
    """The compact line with the full description and the arguments' JSON schemas (compact JSON;
    which are required is already marked in the line: optional names end with `?`)."""
    effect = "" if spec.side_effect == "read" else f" [{spec.side_effect}]"
    head = f"- {spec.name}({', '.join(_param_names(spec))}){effect}: {spec.description.strip()}"
    props = spec.parameters.get("properties", {}) or {}
    schema = json.dumps(props, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return f"{head}\n  arguments: {schema}"


def render_skill(skill: Skill | ExposedSkill) -> str:
    return f"### {skill.app}.{skill.name}\n{skill.text.strip()}"


def _tool_terms(spec: ToolSpec, app: str) -> list[str]:
    words = [spec.name, spec.description, app]
    for pname, prop in (spec.parameters.get("properties", {}) or {}).items():
        words.append(pname)
        if isinstance(prop, dict) and isinstance(prop.get("description"), str):
            words.append(prop["description"])
    return terms(" ".join(words))


#: Renderings, token counts and BM25 indices shared by every adapter in the process: a Harness
#: builds a planner (and its adapter) per episode, and the tools on offer repeat across episodes,
#: so what depends only on a tool's content (or a Skill's, or a tool set's and its library's) is
#: computed once. Keys hold the whole content they depend on; bounded, cleared when full.
_SHARED_MAX = 4096
_RENDERED: dict[tuple[Any, ...], tuple[str, str, int, int]] = {}
_SKILLS_RENDERED: dict[tuple[Any, ...], tuple[str, int]] = {}
_INDICES: dict[tuple[Any, ...], tuple[BM25, BM25]] = {}
_SKILL_INDICES: dict[tuple[tuple[str, str, str], ...], BM25] = {}
#: what `select` and `relevance` decided for a tool set and a query (the instruction's terms),
#: under an adapter's settings: the same task's samples, and any instruction with the same
#: terms, are ranked and rendered once. An answer is copied out, never handed over.
_SELECTIONS: dict[tuple[Any, ...], Exposure] = {}
#: a tool set's renderings and token counts by tool name (`_rendered` of each), and a token
#: counter's count of the two section headers: per tool set, not per task
_SET_RENDERED: dict[tuple[Any, ...], dict[str, tuple[str, str, int, int]]] = {}
_HEADER_TOKENS: dict[Any, tuple[int, int]] = {}
_RELEVANCE: dict[tuple[Any, ...], tuple[dict[str, float], dict[str, float]]] = {}


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _SHARED_MAX:
        cache.clear()
    cache[key] = value


def _content_key(spec: ToolSpec) -> tuple[str, str, str, bytes]:
    """What a tool's ranking and rendering depend on (part of the shared caches' keys)."""
    return (spec.name, spec.description, spec.app, _params(spec))


ToolKey = tuple[str, str, str, bytes]
#: `_content_key` per tool object (`qpa.harness.toolmemo`): a tool set is keyed ~50 times an
#: episode, and an environment offers the same `ToolSpec` objects to every episode
_TOOL_KEY_MEMO: ToolObjectMemo[ToolKey] = ToolObjectMemo(
    _content_key,
    lambda spec: (spec.name, spec.description, spec.app, spec.parameters),
    limit=_SHARED_MAX,
)
_TOOL_KEYS = _TOOL_KEY_MEMO.entries
_memo_tool_key = _TOOL_KEY_MEMO


#: how the adapter keys a tool (the benchmark's "today" path swaps in `_content_key`)
_tool_key = _memo_tool_key


def _fresh(exposure: Exposure, specs: dict[str, ToolSpec]) -> Exposure:
    """A copy of a remembered exposure for this call: its own lists, and the tools it was
    given (the same content under the same names; the remembered one holds an earlier call's)."""
    # built from a validated exposure's own values: nothing to validate again
    return Exposure.model_construct(
        version=exposure.version,
        budget=exposure.budget,
        tools=[specs[t.name] for t in exposure.tools],
        tool_scores=dict(exposure.tool_scores),
        schemas=list(exposure.schemas),
        schema_truncated=list(exposure.schema_truncated),
        tools_dropped=list(exposure.tools_dropped),
        skills=[
            ExposedSkill.model_construct(app=s.app, name=s.name, text=s.text, score=s.score)
            for s in exposure.skills
        ],
        skills_truncated=list(exposure.skills_truncated),
        skills_withheld=list(exposure.skills_withheld),
        text=exposure.text,
        tokens=exposure.tokens,
        over_budget=exposure.over_budget,
    )


def _library_key(skills: SkillLibrary) -> str:
    """What a library's content is (its version and every Skill and description), as a digest."""
    return hashlib.sha256(
        orjson.dumps(skills.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    ).hexdigest()


#: `_library_key` per library object (a `SkillLibrary` is immutable: frozen, and revised only
#: into a new library), held by weak reference so a dropped library's id cannot be mistaken
#: for a new one's: id -> (reference, digest)
_LIBRARY_KEYS: dict[int, tuple[weakref.ref[SkillLibrary], str]] = {}


def _library_digest(skills: SkillLibrary) -> str:
    known = _LIBRARY_KEYS.get(id(skills))
    if known is not None and known[0]() is skills:
        return known[1]
    digest = _library_key(skills)
    if len(_LIBRARY_KEYS) >= _SHARED_MAX:
        _LIBRARY_KEYS.clear()
    _LIBRARY_KEYS[id(skills)] = (weakref.ref(skills), digest)
    return digest


class ScenarioAdapter:
    """Selects and renders the tool documentation and Skills for a task, within a token budget."""

    def __init__(
        self,
        skills: SkillLibrary,
        token_budget: int = 1500,
        max_tools: int | None = None,
        drop_skills: Iterable[str] = frozenset(),
        *,
        count_tokens: TokenCounter = estimate_tokens,
    ) -> None:
        if token_budget < 0:
            raise ValueError(f"token_budget must be >= 0, got {token_budget}")
        if max_tools is not None and max_tools < 1:
            raise ValueError(f"max_tools must be >= 1 or None, got {max_tools}")
        self.skills = skills
        self.token_budget = token_budget
        self.max_tools = max_tools
        self.drop_skills = frozenset(drop_skills)
        self.count_tokens = count_tokens
        self._library: str | None = None  # _library_key(skills), computed on first use

    @property
    def version(self) -> str:
        """Adapter algorithm plus Skill library version, e.g. `bm25-1+skills.v2`."""
        return f"{ADAPTER_VERSION}+skills.{self.skills.version}"

    def app_of(self, spec: ToolSpec) -> str:
        """The tool's app; for tools without one, the longest library app that prefixes its name."""
        if spec.app:
            return spec.app
        candidates = [a for a in self.skills.skills if spec.name.startswith(f"{a}_")]
        return max(candidates, key=len) if candidates else ""

    def _withheld(self, skill: Skill) -> bool:
        return skill.id in self.drop_skills or skill.app in self.drop_skills

    def select(self, task_instruction: str, tools: list[ToolSpec]) -> Exposure:
        """Rank, budget and render the tools on offer and the Skills of their apps."""
        query = terms(task_instruction)
        unique: dict[str, ToolSpec] = {}
        for spec in tools:
            unique.setdefault(spec.name, spec)
        specs = list(unique.values())
        keys = [_tool_key(s) for s in specs]
        settings = (self.count_tokens, self.token_budget, self.max_tools, self.drop_skills)
        memo = (self._library_digest(), *settings, tuple(query), *keys)
        remembered = _SELECTIONS.get(memo)
        if remembered is None:
            remembered = self._select(query, specs, keys)
            _remember(_SELECTIONS, memo, remembered)
        return _fresh(remembered, unique)

    def _select(
        self, query: list[str], specs: list[ToolSpec], keys: list[tuple[str, str, str, bytes]]
    ) -> Exposure:
        apps_of = {s.name: self.app_of(s) for s in specs}
        apps = list(dict.fromkeys(a for a in apps_of.values() if a))

        # relevance: tools, apps (all their docs), skills; app relevance lifts tools and skills
        app_index, tool_index = self._indices(specs, apps_of, apps, keys)
        app_score = dict(zip(apps, app_index.scores(query), strict=True)) if apps else {}
        raw_tool = tool_index.scores(query) if specs else []
        tool_score = {
            s.name: raw + APP_WEIGHT * app_score.get(apps_of[s.name], 0.0)
            for s, raw in zip(specs, raw_tool, strict=True)
        }
        ranked = sorted(specs, key=lambda s: -tool_score[s.name])  # stable: ties keep given order

        dropped: list[str] = []
        if self.max_tools is not None and len(ranked) > self.max_tools:
            dropped = [s.name for s in ranked[self.max_tools :]]
            ranked = ranked[: self.max_tools]
        exposed_apps = [a for a in apps if any(apps_of[s.name] == a for s in ranked)]

        candidates = self.skills.for_apps(exposed_apps)
        withheld = [s.id for s in candidates if self._withheld(s)]
        candidates = [s for s in candidates if not self._withheld(s)]
        raw_skill = self._skill_index(candidates).scores(query) if candidates else []
        skill_score = {
            s.id: raw + APP_WEIGHT * app_score.get(s.app, 0.0)
            for s, raw in zip(candidates, raw_skill, strict=True)
        }
        ranked_skills = sorted(candidates, key=lambda s: -skill_score[s.id])

        return self._budget(
            ranked, tool_score, dropped, ranked_skills, skill_score, withheld, specs, keys
        )

    def relevance(
        self, task_instruction: str, tools: list[ToolSpec]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """BM25 relevance of each app (its docs, tools and Skills) and of each tool alone (no
        app lift) to the instruction: what the Harness's guard reads as the request's scope."""
        unique = list({spec.name: spec for spec in tools}.values())
        if not unique:
            return {}, {}
        keys = [_tool_key(s) for s in unique]
        query = terms(task_instruction)
        memo = (self._library_digest(), tuple(query), *keys)
        remembered = _RELEVANCE.get(memo)
        if remembered is None:
            apps_of = {s.name: self.app_of(s) for s in unique}
            apps = list(dict.fromkeys(a for a in apps_of.values() if a))
            app_index, tool_index = self._indices(unique, apps_of, apps, keys)
            app_score = dict(zip(apps, app_index.scores(query), strict=True)) if apps else {}
            names = [s.name for s in unique]
            remembered = (app_score, dict(zip(names, tool_index.scores(query), strict=True)))
            _remember(_RELEVANCE, memo, remembered)
        return dict(remembered[0]), dict(remembered[1])

    def _library_digest(self) -> str:
        if self._library is None:
            self._library = _library_digest(self.skills)
        return self._library

    def _indices(
        self,
        specs: list[ToolSpec],
        apps_of: dict[str, str],
        apps: list[str],
        keys: list[tuple[str, str, str, bytes]],
    ) -> tuple[BM25, BM25]:
        """BM25 indices of the apps and tools on offer (`keys`: their `_tool_key`s); the same
        tool set reuses its indices."""
        key = (self._library_digest(), *keys)
        cached = _INDICES.get(key)
        if cached is not None:
            return cached
        tool_docs = [_tool_terms(s, apps_of[s.name]) for s in specs]
        app_docs = []
        for app in apps:
            words = [app, self.skills.descriptions.get(app, "")]
            words += [t.text for t in self.skills.for_apps([app])]
            doc = terms(" ".join(words))
            doc += [
                t
                for s, d in zip(specs, tool_docs, strict=True)
                if apps_of[s.name] == app
                for t in d
            ]
            app_docs.append(doc)
        indices = (BM25(app_docs), BM25(tool_docs))
        _remember(_INDICES, key, indices)
        return indices

    def _skill_index(self, candidates: list[Skill]) -> BM25:
        """The BM25 index of these Skills (memoised by their content, as the tools' are)."""
        key = tuple((s.app, s.name, s.text) for s in candidates)
        index = _SKILL_INDICES.get(key)
        if index is None:
            index = BM25([terms(f"{app} {name} {text}") for app, name, text in key])
            _remember(_SKILL_INDICES, key, index)
        return index

    def _rendered(
        self, spec: ToolSpec, tool_key: tuple[str, str, str, bytes] | None = None
    ) -> tuple[str, str, int, int]:
        """Compact and full renderings of a tool with their token counts (memoised by content;
        `tool_key`: its `_tool_key`, when the caller has it)."""
        key = (self.count_tokens, *(tool_key or _tool_key(spec)))
        hit = _RENDERED.get(key)
        if hit is None:
            compact, full = render_compact(spec), render_full(spec)
            hit = (compact, full, self.count_tokens(compact), self.count_tokens(full))
            _remember(_RENDERED, key, hit)
        return hit

    def _set_rendered(
        self, specs: list[ToolSpec], keys: list[tuple[str, str, str, bytes]]
    ) -> dict[str, tuple[str, str, int, int]]:
        """`_rendered` of each tool of a set by name (memoised by the set's content)."""
        key = (self.count_tokens, *keys)
        hit = _SET_RENDERED.get(key)
        if hit is None:
            hit = {s.name: self._rendered(s, k) for s, k in zip(specs, keys, strict=True)}
            _remember(_SET_RENDERED, key, hit)
        return hit

    def _skill_rendered(self, skill: Skill) -> tuple[str, int]:
        key = (self.count_tokens, skill.id, skill.app, skill.name, skill.text)
        hit = _SKILLS_RENDERED.get(key)
        if hit is None:
            text = render_skill(skill)
            hit = (text, self.count_tokens(text))
            _remember(_SKILLS_RENDERED, key, hit)
        return hit

    def _budget(
        self,
        ranked: list[ToolSpec],
        tool_score: dict[str, float],
        dropped: list[str],
        ranked_skills: list[Skill],
        skill_score: dict[str, float],
        withheld: list[str],
        specs: list[ToolSpec],
        keys: list[tuple[str, str, str, bytes]],
    ) -> Exposure:
        count = self.count_tokens
        of_set = self._set_rendered(specs, keys)
        rendered = {s.name: of_set[s.name] for s in ranked}
        compact = {name: r[0] for name, r in rendered.items()}
        full = {name: r[1] for name, r in rendered.items()}
        skills_rendered = {s.id: self._skill_rendered(s) for s in ranked_skills}
        skill_text = {sid: r[0] for sid, r in skills_rendered.items()}
        headers = _HEADER_TOKENS.get(count)
        if headers is None:
            headers = (count(TOOLS_HEADER), count(SKILLS_HEADER))
            _remember(_HEADER_TOKENS, count, headers)
        tools_header, skills_header = headers
        used = (tools_header if ranked else 0) + sum(r[2] for r in rendered.values())
        over = used > self.token_budget

        with_schema: list[str] = []  # order of upgrade, for trimming from the end
        chosen_skills: list[str] = []
        added: list[tuple[str, str]] = []  # ("schema"|"skill", id) in spending order

        def try_schema(name: str) -> None:
            nonlocal used
            extra = max(0, rendered[name][3] - rendered[name][2])
            if used + extra <= self.token_budget:
                used += extra
                with_schema.append(name)
                added.append(("schema", name))

        def try_skill(skill: Skill) -> None:
            nonlocal used
            cost = skills_rendered[skill.id][1] + (0 if chosen_skills else skills_header)
            if used + cost <= self.token_budget:
                used += cost
                chosen_skills.append(skill.id)
                added.append(("skill", skill.id))

        for skill in ranked_skills:
            if skill_score[skill.id] > 0:
                try_skill(skill)
        for spec in ranked:
            if tool_score[spec.name] > 0:
                try_schema(spec.name)
        for skill in ranked_skills:
            if skill_score[skill.id] <= 0:
                try_skill(skill)
        for spec in ranked:
            if tool_score[spec.name] <= 0:
                try_schema(spec.name)

        def render() -> str:
            parts: list[str] = []
            if ranked:
                parts.append(TOOLS_HEADER)
                parts += [
                    full[s.name] if s.name in with_schema else compact[s.name] for s in ranked
                ]
            if chosen_skills:
                parts.append(SKILLS_HEADER)
                parts += [skill_text[i] for i in chosen_skills]
            return "\n".join(parts)

        def total(text: str) -> int:
            """The text's tokens. `estimate_tokens` is additive over newline-joined parts (no
            piece spans a newline), so the parts' known counts add up to the same number."""
            if count is not estimate_tokens:
                return count(text)
            tokens = (tools_header if ranked else 0) + (skills_header if chosen_skills else 0)
            tokens += sum(
                rendered[s.name][3] if s.name in with_schema else rendered[s.name][2]
                for s in ranked
            )
            return tokens + sum(skills_rendered[i][1] for i in chosen_skills)

        text = render()
        tokens = total(text)
        # a real tokenizer need not be additive over the parts: trim the last optional additions
        while tokens > self.token_budget and added and not over:
            kind, ident = added.pop()
            (with_schema if kind == "schema" else chosen_skills).remove(ident)
            text = render()
            tokens = total(text)
        by_id = {s.id: s for s in ranked_skills}
        return Exposure(
            version=self.version,
            budget=self.token_budget,
            tools=ranked,
            tool_scores={s.name: round(tool_score[s.name], 4) for s in ranked},
            schemas=[s.name for s in ranked if s.name in with_schema],
            schema_truncated=[s.name for s in ranked if s.name not in with_schema],
            tools_dropped=dropped,
            skills=[
                ExposedSkill(
                    app=by_id[i].app,
                    name=by_id[i].name,
                    text=by_id[i].text,
                    score=round(skill_score[i], 4),
                )
                for i in chosen_skills
            ],
            skills_truncated=[s.id for s in ranked_skills if s.id not in chosen_skills],
            skills_withheld=withheld,
            text=text,
            tokens=tokens,
            over_budget=tokens > self.token_budget,
        )
