"""Skills library (registry defaults, YAML overlays, revisions) and the Scenario Adapter."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from qpa.contract import Feedback, Finish, Step, ToolSpec
from qpa.envs.sandbox.registry import app_tools, tool_specs
from qpa.harness.adapter import (
    ScenarioAdapter,
    estimate_tokens,
    render_compact,
    stem,
    terms,
    tokenizer_counter,
)
from qpa.harness.skills import SkillLibrary, SkillLibraryError, bump_version

# --------------------------------------------------------------------------- fixtures


def _tool(
    name: str, description: str, app: str, side_effect: str = "read", **params: str
) -> ToolSpec:
    props = {p: {"type": "string", "description": d} for p, d in params.items()}
    return ToolSpec(
        name=name,
        description=description,
        app=app,
        parameters={"type": "object", "properties": props, "required": list(props)},
        side_effect=side_effect,
    )


TOOLS = [
    _tool("weather_forecast", "Get the weather forecast for a city.", "weather", city="City name"),
    _tool("weather_alerts", "List severe weather alerts near the user.", "weather"),
    _tool("shop_search", "Search the shop catalogue for products.", "shop", query="Search words"),
    _tool(
        "shop_checkout",
        "Pay for the cart with a saved card and a delivery address.",
        "shop",
        "payment",
        card="Saved card id",
        address="Delivery address",
    ),
    _tool(
        "sms_send",
        "Send a text message to a phone number now.",
        "sms",
        "write",
        to="Phone",
        text="Body",
    ),
    _tool(
        "sms_schedule",
        "Schedule a text message for later delivery at an ISO time.",
        "sms",
        "write",
        to="Phone number",
        text="Message body",
        send_at="ISO time YYYY-MM-DDTHH:MM",
    ),
    _tool("sms_list_threads", "List text conversations with their latest message.", "sms"),
]

LIBRARY = SkillLibrary(
    version="v1",
    skills={
        "sms": {
            "scheduled_send": (
                "'Send it tomorrow at 8' means sms_schedule with an ISO send_at time, "
                "never sms_send now."
            ),
            "reply_in_thread": (
                "To reply, find the conversation with sms_list_threads, then sms_send "
                "to the thread's phone number."
            ),
        },
        "weather": {
            "units": "Forecasts are in Celsius; convert when the user asks for Fahrenheit.",
        },
        "shop": {
            "checkout": (
                "Before shop_checkout, confirm the card and delivery address with the user; "
                "payment needs explicit confirmation."
            ),
            "returns": "Returns are only possible within 30 days of delivery.",
        },
        "calendar": {"reschedule": "To move an event, update it; never delete and recreate."},
    },
    descriptions={
        "sms": "Text messages: send, schedule and read conversations.",
        "weather": "Weather forecasts and alerts.",
        "shop": "Online shopping: catalogue, cart, checkout and returns.",
    },
)

SCHEDULE = "Tomorrow at 8:00, send Ana Ruiz the text 'Running late, sorry!'"


# --------------------------------------------------------------------------- the library


def test_registry_library_holds_every_apps_skills() -> None:
    lib = SkillLibrary.from_registry()
    assert lib.version == "v1"
    assert "resolve_person" in lib.skills["contacts"]
    assert "scheduled_send" in lib.skills["messaging"]
    assert lib.descriptions["messaging"]
    only = SkillLibrary.from_registry(apps=["messaging", "no_such_app"], version="r7")
    assert only.apps == ["messaging"] and only.version == "r7"
    assert [s.id for s in only.for_apps(["messaging"])] == [
        f"messaging.{n}" for n in sorted(lib.skills["messaging"])
    ]


def test_yaml_round_trip(tmp_path: Path) -> None:
    path = LIBRARY.save(tmp_path / "skills.yaml")
    loaded = SkillLibrary.load(path)
    assert loaded == LIBRARY
    assert loaded.fingerprint() == LIBRARY.fingerprint()
    assert SkillLibrary.from_yaml(LIBRARY.to_yaml()) == LIBRARY


def test_revise_bumps_version_and_leaves_the_original() -> None:
    revised = LIBRARY.revise("sms", "scheduled_send", "Use sms_schedule; send_at is local time.")
    assert revised.version == "v2"
    assert revised.get("sms", "scheduled_send") == "Use sms_schedule; send_at is local time."
    assert LIBRARY.get("sms", "scheduled_send") != revised.get("sms", "scheduled_send")
    assert LIBRARY.version == "v1"
    assert revised.fingerprint() != LIBRARY.fingerprint()
    added = revised.revise("maps", "route", "Ask for the travel mode first.", version="exp-1")
    assert added.version == "exp-1" and added.get("maps", "route")
    removed = added.remove("maps", "route")
    assert removed.version == "exp-2" and "maps" not in removed.skills
    with pytest.raises(KeyError):
        removed.remove("maps", "route")
    with pytest.raises(ValueError, match="non-empty"):
        LIBRARY.revise("sms", "x", "   ")
    with pytest.raises(ValueError, match="no dots"):
        LIBRARY.revise("sms", "bad.name", "text")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("v1", "v2"),
        ("v9", "v10"),
        ("2026.03", "2026.04"),
        ("registry", "registry.1"),
        ("r007", "r008"),
    ],
)
def test_bump_version(before: str, after: str) -> None:
    assert bump_version(before) == after


def test_yaml_overlay_extends_registry(tmp_path: Path) -> None:
    (tmp_path / "skills-v2.yaml").write_text(
        """
version: v2
extends: registry
skills:
  messaging:
    scheduled_send: |
      Send it tomorrow at 8 means messaging_schedule with send_at=YYYY-MM-DDTHH:MM.
    reply_in_thread: null
  contacts:
    dedupe: Search before contacts_create; never add a second contact with the same phone.
"""
    )
    base = SkillLibrary.from_registry()
    v2 = SkillLibrary.load(tmp_path / "skills-v2.yaml")
    assert v2.version == "v2"
    assert v2.get("messaging", "scheduled_send") == (
        "Send it tomorrow at 8 means messaging_schedule with send_at=YYYY-MM-DDTHH:MM."
    )
    assert v2.get("messaging", "reply_in_thread") is None
    assert v2.get("contacts", "dedupe") is not None
    assert v2.get("contacts", "resolve_person") == base.get("contacts", "resolve_person")
    # a chain: v3 extends v2 by a relative path and gets a bumped version when it names none
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "v3.yaml").write_text(
        "extends: ../skills-v2.yaml\nskills:\n  contacts:\n    dedupe: null\n"
    )
    v3 = SkillLibrary.load(tmp_path / "sub" / "v3.yaml")
    assert v3.version == "v3" and v3.get("contacts", "dedupe") is None


def test_yaml_errors_name_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nskills:\n  sms:\n    scheduled_send: 42\n")
    with pytest.raises(SkillLibraryError, match=r"bad\.yaml.*skills\.sms\.scheduled_send"):
        SkillLibrary.load(bad)
    bad.write_text("version: v1\nskils: {}\n")
    with pytest.raises(SkillLibraryError, match=r"unknown field.*skils"):
        SkillLibrary.load(bad)
    bad.write_text("version: v1\nskills:\n  'sms.x':\n    a: text\n")
    with pytest.raises(SkillLibraryError, match="no dots"):
        SkillLibrary.load(bad)
    bad.write_text("- a list\n")
    with pytest.raises(SkillLibraryError, match="mapping"):
        SkillLibrary.load(bad)
    bad.write_text("version: 'has space'\n")
    with pytest.raises(SkillLibraryError, match="version"):
        SkillLibrary.load(bad)
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(SkillLibraryError, match="cycle"):
        SkillLibrary.load(tmp_path / "a.yaml")
    with pytest.raises(SkillLibraryError, match="cannot read"):
        SkillLibrary.load(tmp_path / "missing.yaml")


# --------------------------------------------------------------------------- relevance


def test_terms_stem_and_drop_stopwords() -> None:
    assert stem("messages") == stem("message") == "messag"
    assert stem("scheduled") == stem("schedule") == stem("scheduling")
    assert stem("preferred") == "prefer"
    assert terms("Please send my messages_to the shop") == ["send", "messag", "shop"]


def test_selection_prefers_the_relevant_apps_skills_over_distractors() -> None:
    exposure = ScenarioAdapter(LIBRARY, token_budget=10_000).select(SCHEDULE, TOOLS)
    assert exposure.skill_ids[0] == "sms.scheduled_send"
    assert set(exposure.skill_ids[:2]) == {"sms.scheduled_send", "sms.reply_in_thread"}
    assert set(exposure.tool_names[:3]) == {"sms_schedule", "sms_send", "sms_list_threads"}
    # only apps whose tools are on offer: calendar has skills but no tools here
    assert not any(
        i.startswith("calendar.") for i in exposure.skill_ids + exposure.skills_truncated
    )

    shopping = ScenarioAdapter(LIBRARY, token_budget=10_000).select(
        "Buy the cheapest umbrella in the shop and pay with my saved card", TOOLS
    )
    assert shopping.skill_ids[0] == "shop.checkout"
    assert shopping.tool_names[0] in {"shop_checkout", "shop_search"}

    # a tight budget keeps the relevant app's Skills and records the distractors as truncated
    tight = ScenarioAdapter(LIBRARY, token_budget=200).select(SCHEDULE, TOOLS)
    assert tight.skill_ids == ["sms.scheduled_send"]
    assert {"weather.units", "shop.checkout", "shop.returns"} <= set(tight.skills_truncated)
    assert tight.tokens <= 200
    # with more room the relevant app's Skills still come first
    roomier = ScenarioAdapter(LIBRARY, token_budget=300).select(SCHEDULE, TOOLS)
    assert roomier.skill_ids[:2] == ["sms.scheduled_send", "sms.reply_in_thread"]


def test_only_skills_of_available_apps() -> None:
    weather_only = [t for t in TOOLS if t.app == "weather"]
    exposure = ScenarioAdapter(LIBRARY).select(SCHEDULE, weather_only)
    assert exposure.skill_ids == ["weather.units"]
    assert exposure.tool_names == ["weather_forecast", "weather_alerts"]
    assert ScenarioAdapter(LIBRARY).select(SCHEDULE, []).text == ""


def test_tool_without_app_is_attributed_by_name_prefix() -> None:
    anonymous = [t.model_copy(update={"app": ""}) for t in TOOLS if t.app == "sms"]
    exposure = ScenarioAdapter(LIBRARY).select(SCHEDULE, anonymous)
    assert exposure.skill_ids[0] == "sms.scheduled_send"


# --------------------------------------------------------------------------- budget


@pytest.mark.parametrize("budget", [150, 200, 300, 450, 800, 5000])
def test_budget_is_respected_and_every_tool_kept(budget: int) -> None:
    exposure = ScenarioAdapter(LIBRARY, token_budget=budget).select(SCHEDULE, TOOLS)
    assert exposure.tokens == estimate_tokens(exposure.text)
    assert exposure.tokens <= budget
    assert not exposure.over_budget
    assert sorted(exposure.tool_names) == sorted(t.name for t in TOOLS)
    for tool in TOOLS:  # never dropped: at least name and short description
        assert f"- {tool.name}(" in exposure.text
    assert set(exposure.schemas) | set(exposure.schema_truncated) == {t.name for t in TOOLS}
    assert not set(exposure.schemas) & set(exposure.schema_truncated)
    every = {s.id for s in LIBRARY.for_apps(["sms", "weather", "shop"])}
    assert set(exposure.skill_ids) | set(exposure.skills_truncated) == every
    notes = exposure.annotations()
    assert notes["tools_schema_truncated"] == exposure.schema_truncated
    assert notes["skills_truncated"] == exposure.skills_truncated
    for name in exposure.schemas:
        assert re.search(rf"- {name}\(.*\n  arguments: ", exposure.text)


def test_more_budget_never_shows_less() -> None:
    shown = [
        ScenarioAdapter(LIBRARY, token_budget=b).select(SCHEDULE, TOOLS)
        for b in (150, 300, 600, 5000)
    ]
    for small, big in itertools.pairwise(shown):
        assert len(big.schemas) + len(big.skills) >= len(small.schemas) + len(small.skills)
    assert not shown[-1].schema_truncated and not shown[-1].skills_truncated


def test_over_budget_keeps_names_and_short_descriptions() -> None:
    exposure = ScenarioAdapter(LIBRARY, token_budget=20).select(SCHEDULE, TOOLS)
    assert exposure.over_budget
    assert exposure.schemas == [] and exposure.skills == []
    assert exposure.schema_truncated == exposure.tool_names
    for tool in TOOLS:
        assert render_compact(tool) in exposure.text
    notes = exposure.annotations()
    assert notes["adapter_over_budget"] is True
    assert len(notes["skills_truncated"]) == 5


def test_max_tools_caps_by_relevance_and_records_the_rest() -> None:
    exposure = ScenarioAdapter(LIBRARY, max_tools=3).select("Schedule a text to Ana", TOOLS)
    assert len(exposure.tools) == 3 and exposure.tool_names[0] == "sms_schedule"
    assert len(exposure.tools_dropped) == 4
    assert {"weather_forecast", "weather_alerts"} <= set(exposure.tools_dropped)
    assert exposure.annotations()["tools_dropped"] == exposure.tools_dropped
    assert not any(s.startswith("weather.") for s in exposure.skill_ids + exposure.skills_truncated)


def test_swappable_token_counter() -> None:
    chars = ScenarioAdapter(LIBRARY, token_budget=900, count_tokens=len).select(SCHEDULE, TOOLS)
    assert chars.tokens == len(chars.text) <= 900

    # a counter that is not additive over the parts (the joins cost): trimmed to fit anyway
    def costly_lines(text: str) -> int:
        return estimate_tokens(text) + 10 * text.count("\n")

    trimmed = ScenarioAdapter(LIBRARY, token_budget=400, count_tokens=costly_lines).select(
        SCHEDULE, TOOLS
    )
    assert trimmed.tokens == costly_lines(trimmed.text) <= 400

    class FakeTokenizer:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [0] * len(text.split())

    counter = tokenizer_counter(FakeTokenizer())
    assert counter("a b c") == 3


def test_estimate_tokens_is_cheap_and_sane() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("send a text") == 3
    assert estimate_tokens("2026-03-03T08:00") == 16  # digits and marks count one each
    assert estimate_tokens("internationalization") == 3


# --------------------------------------------------------------------------- faults and records


def test_drop_skills_withholds_a_needed_skill() -> None:
    faulty = ScenarioAdapter(LIBRARY, drop_skills={"sms.scheduled_send"}).select(SCHEDULE, TOOLS)
    assert "sms.scheduled_send" not in faulty.skill_ids
    assert "sms.scheduled_send" not in faulty.skills_truncated
    assert "sms_schedule with an ISO" not in faulty.text
    assert faulty.skills_withheld == ["sms.scheduled_send"]
    assert faulty.annotations()["skills_withheld"] == ["sms.scheduled_send"]
    assert "sms.reply_in_thread" in faulty.skill_ids

    whole_app = ScenarioAdapter(LIBRARY, drop_skills={"sms"}).select(SCHEDULE, TOOLS)
    assert not any(s.startswith("sms.") for s in whole_app.skill_ids)
    assert sorted(whole_app.skills_withheld) == ["sms.reply_in_thread", "sms.scheduled_send"]
    assert "sms_schedule" in whole_app.tool_names  # tools are never withheld

    healthy = ScenarioAdapter(LIBRARY).select(SCHEDULE, TOOLS)
    assert "skills_withheld" not in healthy.annotations()


def test_annotations_go_into_a_step() -> None:
    adapter = ScenarioAdapter(LIBRARY.revise("sms", "extra", "Keep texts short."), token_budget=600)
    exposure = adapter.select(SCHEDULE, TOOLS)
    notes = exposure.annotations()
    assert notes["skills_exposed"] == [f"{s.app}.{s.name}" for s in exposure.skills]
    assert notes["tools_exposed"] == [t.name for t in exposure.tools]
    assert notes["adapter_tokens"] == exposure.tokens
    assert notes["adapter_version"] == "bm25-1+skills.v2" == adapter.version
    step = Step(index=0, action=Finish(), feedback=Feedback(), annotations=notes)
    again = Step.model_validate_json(step.model_dump_json())
    assert again.annotations == notes
    assert exposure.model_validate_json(exposure.model_dump_json()) == exposure


def test_selection_is_deterministic() -> None:
    a = ScenarioAdapter(LIBRARY, token_budget=300).select(SCHEDULE, TOOLS)
    b = ScenarioAdapter(LIBRARY, token_budget=300).select(SCHEDULE, list(TOOLS))
    assert a == b


def test_invalid_settings() -> None:
    with pytest.raises(ValueError, match="token_budget"):
        ScenarioAdapter(LIBRARY, token_budget=-1)
    with pytest.raises(ValueError, match="max_tools"):
        ScenarioAdapter(LIBRARY, max_tools=0)


def test_registry_apps_end_to_end() -> None:
    tools = tool_specs(app_tools("contacts") + app_tools("messaging"))
    lib = SkillLibrary.from_registry(apps=["contacts", "messaging"])
    exposure = ScenarioAdapter(lib, token_budget=1500).select(
        'Tomorrow at 9:00, send Dana Reyes the text "The meeting moved to Room 4B."', tools
    )
    assert exposure.skill_ids[0] == "messaging.scheduled_send"
    assert exposure.tool_names.index("messaging_schedule") < exposure.tool_names.index(
        "contacts_delete"
    )
    assert exposure.tokens <= 1500 and sorted(exposure.tool_names) == sorted(t.name for t in tools)
    fault = ScenarioAdapter(lib, drop_skills={"messaging.scheduled_send"}).select(
        "Tomorrow at 9:00, text Dana", tools
    )
    assert "messaging.scheduled_send" not in fault.skill_ids
