"""The `longtail` suite: tasks on the shipped LLM-simulated apps, judged by rubrics.

Each task's world is `{"_llmsim": {"apps": [...], "facts": ..., "state": ...}}`: the facts fix
the entities a plan relies on (ids, dates, prices), the model invents the rest consistently.
Reference plans use literal ids where the facts define them and `${i.path}` references where
the simulated backend creates or looks them up. `longtail_tasks()` builds the suite (the same
tasks every call); `get_longtail_task(id)` picks one.
"""

from __future__ import annotations

from typing import Any

from qpa.contract import (
    Action,
    Capability,
    Finish,
    MemoryItem,
    Split,
    Task,
    ToolCall,
    VerifierSpec,
)
from qpa.envs.llmsim.env import WORLD_KEY

LONGTAIL_SUITE = "longtail"

_PARKING_FACTS = (
    "Today is Monday 2026-03-02. The user lives at 12 Harbor Street (zone Z4 'Harbourside', "
    "15.00 per month) and has two registered vehicles: KX-4821 (blue hatchback) and LM-1190 "
    "(grey van). Permit PP-204817 (KX-4821, zone Z4) is active from 2025-09-15 to 2026-03-15. "
    "Permit PP-199203 (LM-1190, zone Z4) is active from 2025-08-01 to 2026-08-01. "
    "88 Elm Road lies in zone Z7 'Elm Quarter' (18.00 per month); residents are eligible."
)
_PARKING_STATE: dict[str, Any] = {
    "vehicles": [{"plate": "KX-4821"}, {"plate": "LM-1190"}],
    "permits": [
        {
            "id": "PP-204817",
            "plate": "KX-4821",
            "zone_id": "Z4",
            "status": "active",
            "valid_from": "2025-09-15",
            "expires_on": "2026-03-15",
        },
        {
            "id": "PP-199203",
            "plate": "LM-1190",
            "zone_id": "Z4",
            "status": "active",
            "valid_from": "2025-08-01",
            "expires_on": "2026-08-01",
        },
    ],
    "zones": [
        {"id": "Z4", "name": "Harbourside", "monthly_fee": 15.0},
        {"id": "Z7", "name": "Elm Quarter", "monthly_fee": 18.0},
    ],
}

_GROOMING_FACTS = (
    "Today is Monday 2026-03-02. The user's pets: Biscuit (dog, beagle) and Luna (cat). "
    "Services: svc_dog_full 'Full groom' (dog, 90 min, 65.00), svc_dog_bath 'Bath & brush' "
    "(dog, 45 min, 35.00), svc_cat_groom 'Cat groom' (cat, 60 min, 55.00). Free slots for the "
    "full groom on 2026-03-06: slot_0306_0930 (Maya), slot_0306_1100 (Tom), slot_0306_1430 "
    "(Maya). Booked: apt_5521 (Luna, svc_cat_groom, 2026-03-04T10:00) and apt_5522 (Biscuit, "
    "svc_dog_bath, 2026-03-09T16:00)."
)
_GROOMING_STATE: dict[str, Any] = {
    "pets": [{"name": "Biscuit", "type": "dog"}, {"name": "Luna", "type": "cat"}],
    "appointments": [
        {
            "id": "apt_5521",
            "pet_name": "Luna",
            "service_id": "svc_cat_groom",
            "start": "2026-03-04T10:00",
            "status": "booked",
        },
        {
            "id": "apt_5522",
            "pet_name": "Biscuit",
            "service_id": "svc_dog_bath",
            "start": "2026-03-09T16:00",
            "status": "booked",
        },
    ],
    "free_slots": {
        "svc_dog_full@2026-03-06": ["slot_0306_0930", "slot_0306_1100", "slot_0306_1430"]
    },
}

_LIBRARY_FACTS = (
    "Today is Monday 2026-03-02. The user's loans: ln_801 'Dune' (itm_1201, due 2026-03-05, "
    "2 renewals left), ln_802 'The Overstory' (itm_1388, due 2026-03-07, 1 renewal left), "
    "ln_803 'Piranesi' (itm_1502, due 2026-03-20, 2 renewals left). Nobody holds these items. "
    "Fines due: 4.50. The catalogue has 'The Left Hand of Darkness' by Ursula K. Le Guin as "
    "itm_4410 (book, 0 copies available, 2 readers queued) and itm_4411 (audiobook, 1 copy)."
)
_LIBRARY_STATE: dict[str, Any] = {
    "loans": [
        {
            "id": "ln_801",
            "item_id": "itm_1201",
            "title": "Dune",
            "due_on": "2026-03-05",
            "renewals_left": 2,
        },
        {
            "id": "ln_802",
            "item_id": "itm_1388",
            "title": "The Overstory",
            "due_on": "2026-03-07",
            "renewals_left": 1,
        },
        {
            "id": "ln_803",
            "item_id": "itm_1502",
            "title": "Piranesi",
            "due_on": "2026-03-20",
            "renewals_left": 2,
        },
    ],
    "fines_due": 4.5,
}


def _world(app: str, facts: str, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {WORLD_KEY: {"apps": [app], "facts": facts, "state": state, "start": "2026-03-02T09:00"}}


def _task(
    name: str,
    *,
    domain: str,
    app: str,
    facts: str,
    state: dict[str, Any],
    split: Split,
    instruction: str,
    rubric: list[str],
    plan: list[Action],
    capabilities: list[Capability] | None = None,
    difficulty: int = 1,
    confirmations: list[str] | None = None,
    memory: list[MemoryItem] | None = None,
) -> Task:
    return Task(
        id=f"{domain}.{name}.{split}.000",
        suite=LONGTAIL_SUITE,
        split=split,
        domain=domain,
        capabilities=capabilities or ["tool_use"],
        difficulty=difficulty,
        instruction=instruction,
        memory=memory or [],
        apps=[app],
        world=_world(app, facts, state),
        verifier=VerifierSpec(kind="rubric", rubric=rubric),
        reference_plan=plan,
        confirmations=confirmations or [],
        source="handwritten",
        template=name,
        lineage={"generator": "llmsim.tasks"},
    )


def longtail_tasks() -> tuple[Task, ...]:
    """The `longtail` suite, all splits (deterministic: the same tasks on every call)."""
    return (
        _task(
            "renew_permit",
            domain="parking",
            app="parking_permits",
            facts=_PARKING_FACTS,
            state=_PARKING_STATE,
            split="train",
            instruction="Renew the residential parking permit of my car KX-4821 for 6 months.",
            rubric=[
                "The permit renewed is PP-204817, the one of vehicle KX-4821 (not LM-1190's).",
                "The renewal was for exactly 6 months.",
                "No other permit was bought, renewed or cancelled.",
            ],
            plan=[
                ToolCall(tool="get_permit_status", arguments={"plate": "KX-4821"}),
                ToolCall(tool="renew_permit", arguments={"permit_id": "PP-204817", "months": 6}),
                Finish(answer="Your permit PP-204817 for KX-4821 is renewed for 6 months."),
            ],
            confirmations=["renew_permit"],
        ),
        _task(
            "permit_new_address",
            domain="parking",
            app="parking_permits",
            facts=_PARKING_FACTS,
            state=_PARKING_STATE,
            split="test",
            instruction=(
                "I'm moving to 88 Elm Road. Find its permit zone and buy a 12-month permit "
                "there for my car KX-4821."
            ),
            rubric=[
                "The agent looked up the permit zone of 88 Elm Road.",
                "A 12-month permit was bought for KX-4821 in the zone the lookup returned (Z7).",
                "The existing permit PP-204817 was not cancelled (the user did not ask for it).",
            ],
            plan=[
                ToolCall(tool="find_zone", arguments={"address": "88 Elm Road"}),
                ToolCall(
                    tool="apply_permit",
                    arguments={"plate": "KX-4821", "zone_id": "${0.zone.id}", "months": 12},
                ),
                Finish(answer="You now have a 12-month permit for KX-4821 in the Elm Road zone."),
            ],
            difficulty=2,
            confirmations=["apply_permit"],
        ),
        _task(
            "book_full_groom",
            domain="pet_care",
            app="pet_grooming",
            facts=_GROOMING_FACTS,
            state=_GROOMING_STATE,
            split="test",
            instruction=(
                "Book a full groom for my dog Biscuit on 2026-03-06, the earliest slot that day."
            ),
            rubric=[
                "An appointment was booked for Biscuit.",
                "The booked service is the full groom (svc_dog_full).",
                "The booked slot is the earliest free one on 2026-03-06 (09:30, slot_0306_0930).",
            ],
            plan=[
                ToolCall(
                    tool="find_slots",
                    arguments={"service_id": "svc_dog_full", "date": "2026-03-06"},
                ),
                ToolCall(
                    tool="book_appointment",
                    arguments={
                        "service_id": "svc_dog_full",
                        "slot_id": "${0.slots.0.id}",
                        "pet_name": "Biscuit",
                    },
                ),
                Finish(answer="Biscuit is booked for a full groom on 2026-03-06."),
            ],
            difficulty=2,
        ),
        _task(
            "cancel_cat_appointment",
            domain="pet_care",
            app="pet_grooming",
            facts=_GROOMING_FACTS,
            state=_GROOMING_STATE,
            split="train",
            instruction="Cancel my cat Luna's grooming appointment, I can't make it.",
            rubric=[
                "Luna's appointment apt_5521 was cancelled.",
                "Biscuit's appointment apt_5522 was not cancelled.",
            ],
            plan=[
                ToolCall(tool="list_appointments", arguments={"pet_name": "Luna"}),
                ToolCall(
                    tool="cancel_appointment",
                    arguments={"appointment_id": "${0.appointments.0.id}"},
                ),
                Finish(answer="Luna's appointment is cancelled."),
            ],
        ),
        _task(
            "renew_due_loans",
            domain="library",
            app="library_loans",
            facts=_LIBRARY_FACTS,
            state=_LIBRARY_STATE,
            split="test",
            instruction="Renew every library loan of mine that is due within the next 7 days.",
            rubric=[
                "Loan ln_801 (Dune, due 2026-03-05) was renewed.",
                "Loan ln_802 (The Overstory, due 2026-03-07) was renewed.",
                "Loan ln_803 (Piranesi, due 2026-03-20) was not renewed.",
            ],
            plan=[
                ToolCall(tool="list_loans", arguments={}),
                ToolCall(tool="renew_loan", arguments={"loan_id": "ln_801"}),
                ToolCall(tool="renew_loan", arguments={"loan_id": "ln_802"}),
                Finish(answer="Renewed Dune and The Overstory."),
            ],
            difficulty=2,
        ),
        _task(
            "hold_at_usual_branch",
            domain="library",
            app="library_loans",
            facts=_LIBRARY_FACTS,
            state=_LIBRARY_STATE,
            split="train",
            instruction=(
                "Put a hold on the book 'The Left Hand of Darkness' for pickup at my usual branch."
            ),
            rubric=[
                "A hold was placed on the print book of 'The Left Hand of Darkness' (itm_4410), "
                "not on another format.",
                "The pickup branch is eastside, the user's usual branch.",
            ],
            plan=[
                ToolCall(
                    tool="search_catalog",
                    arguments={"query": "The Left Hand of Darkness", "format": "book"},
                ),
                ToolCall(
                    tool="place_hold",
                    arguments={"item_id": "${0.items.0.id}", "pickup_branch": "eastside"},
                ),
                Finish(answer="The book is on hold for pickup at Eastside."),
            ],
            capabilities=["tool_use", "memory"],
            difficulty=2,
            memory=[
                MemoryItem(
                    key="library_branch", value="eastside", evidence="confirmed", source="history"
                )
            ],
        ),
        _task(
            "pay_library_fines",
            domain="library",
            app="library_loans",
            facts=_LIBRARY_FACTS,
            state=_LIBRARY_STATE,
            split="validation",
            instruction="Pay off my library fines.",
            rubric=[
                "The fines were paid in full (4.50).",
                "No loan was renewed and no hold was placed or cancelled.",
            ],
            plan=[
                ToolCall(tool="list_loans", arguments={}),
                ToolCall(tool="pay_fines", arguments={"amount": "${0.fines_due}"}),
                Finish(answer="Your library fines are paid."),
            ],
            confirmations=["pay_fines"],
        ),
    )


def get_longtail_task(task_id: str) -> Task:
    """One task of the suite by id (KeyError names the id)."""
    for task in longtail_tasks():
        if task.id == task_id:
            return task
    raise KeyError(f"no task {task_id!r} in suite {LONGTAIL_SUITE!r}")
