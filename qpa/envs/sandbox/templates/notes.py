"""Notes and reminders tasks: share notes, keep lists, finish projects, usual lists and notes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from qpa.contract import Check, Delegate, Finish, MemoryItem, ToolCall
from qpa.envs.sandbox.apps.messaging import message_record
from qpa.envs.sandbox.apps.notes import folder_record, note_record
from qpa.envs.sandbox.apps.reminders import list_record, reminder_record
from qpa.envs.sandbox.authoring import contacts_world, day_phrase, recall, texted, texts_sent
from qpa.envs.sandbox.suite import TaskGen, template
from qpa.envs.sandbox.worldgen import FIRST, WORKDAYS, iso

NOW = "2026-03-02T09:00"
CHORES = [
    "Buy printer ink",
    "Renew library card",
    "Fix the squeaky door",
    "Return the parcel",
    "Book car wash",
    "Clean the gutters",
    "Order contact lenses",
    "Descale the kettle",
    "Call the bank",
    "Update the CV",
    "Back up the laptop",
    "Water the ferns",
    "Replace the shower head",
    "Sort the recycling",
    "Pay the parking fine",
    "Defrost the freezer",
    "Reply to the landlord",
    "Book an eye test",
    "Buy a birthday card",
    "Oil the bike chain",
    "Send the holiday photos",
    "Cancel the gym trial",
    "Hang the mirror",
    "Donate old clothes",
]
LIST_NAMES = ["Home", "Work", "Errands", "Garden", "Kids", "Health"]
DUE_TIMES = ["08:00", "09:00", "12:00", "17:30", "18:00", "19:00", "20:00"]


def _lists(names: list[str]) -> list[dict[str, Any]]:
    return [list_record(f"rl_{n.lower()}", n) for n in names]


def _note_kinds(g: TaskGen) -> list[tuple[str, str, str]]:
    """(title, body, the fact a recipient needs) for notes people share."""
    r = g.rng
    code, flat, bay, pw = (
        r.randint(1000, 9999),
        r.randint(2, 40),
        r.randint(10, 99),
        r.randint(100, 999),
    )
    combo = f"{r.randint(10, 39)}-{r.randint(10, 39)}-{r.randint(10, 39)}"
    flight = f"{r.choice(['BA', 'LH', 'AF', 'KL', 'UA'])}{r.randint(100, 999)}"
    book = r.choice(["Piranesi", "Klara and the Sun", "The Overstory", "Circe", "Educated", "Dune"])
    allergy = r.choice(["peanuts", "kiwi", "shellfish", "sesame", "eggs"])
    address = g.fake.address()
    return [
        ("Gate code", f"Building gate: {code}#\nFlat {flat}", f"{code}#"),
        ("Parking spot", f"Level P{r.randint(1, 4)}, bay {bay}", f"bay {bay}"),
        ("Guest Wi-Fi", f"Network: Casa-{flat}\nPassword: sunny-{pw}", f"sunny-{pw}"),
        ("Book club pick", f"Next book: {book}, chapters 1-{r.randint(4, 12)}", book),
        ("Dinner address", f"{address}, buzzer {flat}", address),
        ("Flight details", f"Flight {flight}, seat {r.randint(3, 40)}{r.choice('ABCDEF')}", flight),
        ("Babysitter notes", f"Bedtime 19:30. Allergic to {allergy}.", allergy),
        ("Locker combo", f"Gym locker {flat}: {combo}", combo),
    ]


# --------------------------------------------------------------------------- tool_use


@template(
    domain="notes", capabilities=["tool_use"], apps=["notes", "contacts", "messaging"], difficulty=2
)
def text_note_to_contact(g: TaskGen) -> Any:
    people = contacts_world(g.fake, favorite_rate=0.25)
    friend = g.rng.choice(people)
    kinds = _note_kinds(g)
    g.rng.shuffle(kinds)
    title, _, fact = kinds[0]
    notes = [note_record(f"n_{101 + i}", t, b) for i, (t, b, _) in enumerate(kinds[:6])]
    old_body, old_fact = next((b, f) for t, b, f in _note_kinds(g) if t == title)
    stale = g.rng.random() < 0.5 and old_fact != fact
    if stale:
        notes.append(note_record("n_199", f"{title} (old)", old_body))
    g.rng.shuffle(notes)
    return g.task(
        instruction=f"Send {friend['name']} what's in my '{title}' note.",
        world={
            "notes": {"folders": [folder_record("f_notes", "Notes")], "notes": notes},
            "contacts": {"contacts": people},
            "messaging": {"messages": []},
        },
        checks=[
            texted(
                "note contents texted",
                {"to": friend["phone"], "sender": "me", "text__contains": fact},
            ),
            texts_sent(1, "one text only"),
        ],
        plan=[
            ToolCall(tool="notes_search", arguments={"query": title}),
            ToolCall(tool="contacts_search", arguments={"query": friend["name"]}),
            ToolCall(
                tool="messaging_send", arguments={"to": "${1.0.phone}", "text": "${0.0.body}"}
            ),
            Finish(),
        ],
        difficulty=3 if stale else 2,
    )


@template(domain="notes", capabilities=["tool_use"], apps=["reminders"], difficulty=3)
def push_overdue_reminders(g: TaskGen) -> Any:
    names = g.rng.sample(LIST_NAMES, 3)
    target, other = names[0], names[1]
    tid, oid = f"rl_{target.lower()}", f"rl_{other.lower()}"
    chores = g.rng.sample(CHORES, 10)
    n_over = g.rng.choice([2, 3])
    past = [
        datetime(2026, 2, 24) + timedelta(days=d, hours=h)
        for d, h in [(0, 9), (1, 18), (3, 12), (4, 8), (5, 19)]
    ]
    g.rng.shuffle(past)
    rows: list[dict[str, Any]] = []
    overdue = []
    for i in range(n_over):
        rid = f"r_{101 + i}"
        overdue.append(rid)
        rows.append(reminder_record(rid, chores[i], tid, due=iso(past[i])))
    rows.append(reminder_record("r_120", chores[5], tid, due=iso(past[3]), completed=True))
    rows.append(reminder_record("r_121", chores[6], tid, due="2026-03-04T18:00"))
    rows.append(reminder_record("r_122", chores[7], tid))
    rows.append(reminder_record("r_130", chores[8], oid, due=iso(past[4])))
    rows.append(reminder_record("r_131", chores[9], oid, due="2026-03-05T10:00"))
    g.rng.shuffle(rows)
    day = g.rng.choice(WORKDAYS)
    hhmm = g.rng.choice(DUE_TIMES)
    new_due = f"{day:%Y-%m-%d}T{hhmm}"
    return g.task(
        instruction=(
            f"Push everything overdue in my {target} reminders to {day_phrase(day)} at {hhmm}."
        ),
        world={"reminders": {"lists": _lists(names), "reminders": rows}},
        checks=[
            *(
                Check(
                    name=f"overdue {rid} pushed",
                    target="reminders.reminders",
                    where={"id": rid, "due": new_due, "completed": False},
                )
                for rid in overdue
            ),
            Check(
                name="only overdue ones moved",
                target="reminders.reminders",
                op="count",
                where={"due": new_due},
                expect=n_over,
            ),
            Check(
                name="other list untouched",
                target="reminders.reminders",
                where={"id": "r_130", "due": iso(past[4])},
            ),
        ],
        plan=[
            ToolCall(tool="reminders_list_lists", arguments={}),
            ToolCall(tool="reminders_list", arguments={"list_id": tid, "due_before": NOW}),
            *(
                ToolCall(
                    tool="reminders_update",
                    arguments={"reminder_id": f"${{1.reminders.{i}.id}}", "due": new_due},
                )
                for i in range(n_over)
            ),
            Finish(),
        ],
        difficulty=3 if n_over == 2 else 4,
    )


# --------------------------------------------------------------------------- skills

GROCERIES = [
    "eggs",
    "basil",
    "rice",
    "oat milk",
    "lemons",
    "coffee beans",
    "tomatoes",
    "butter",
    "spinach",
    "yogurt",
    "bread",
    "garlic",
    "olive oil",
    "bananas",
    "cheddar",
    "pasta",
    "chickpeas",
    "honey",
    "carrots",
    "tortillas",
    "apples",
    "mushrooms",
    "salmon",
    "peppers",
]


@template(domain="notes", capabilities=["skills"], apps=["notes"], difficulty=2)
def add_to_grocery_list(g: TaskGen) -> Any:
    pool = g.rng.sample(GROCERIES, 8)
    on_list = pool[:5]
    done = set(g.rng.sample(on_list, 2))
    checklist = [{"text": item, "done": item in done} for item in on_list]
    revive = g.rng.random() < 0.6
    wanted = [*pool[5:8]] if not revive else [*pool[5:7], next(iter(sorted(done)))]
    g.rng.shuffle(wanted)
    body = "Weekly shop. Farmers market on Saturday."
    hardware = [{"text": t, "done": False} for t in ("screws", "wood glue", "sandpaper")]
    notes = [
        note_record(
            "n_301", "Grocery list", body, folder="Lists", checklist=checklist, pinned=True
        ),
        note_record("n_302", "Hardware store", "", folder="Lists", checklist=hardware),
        note_record(
            "n_303",
            "Packing list",
            "Weekend trip",
            folder="Lists",
            checklist=[{"text": "charger", "done": False}, {"text": "socks", "done": True}],
        ),
        note_record("n_304", "Meal ideas", "Lentil soup, tacos, risotto"),
    ]
    plan: list[Any] = [ToolCall(tool="notes_search", arguments={"query": "Grocery list"})]
    for item in wanted:
        if item not in done:
            plan.append(
                ToolCall(
                    tool="notes_add_checklist_item",
                    arguments={"note_id": "${0.0.id}", "text": item},
                )
            )
    for item in wanted:
        if item in done:
            plan.append(
                ToolCall(
                    tool="notes_check_item",
                    arguments={"note_id": "${0.0.id}", "text": item, "done": False},
                )
            )
    plan.append(Finish())
    return g.task(
        instruction=f"Put {wanted[0]}, {wanted[1]} and {wanted[2]} on my grocery list.",
        world={
            "notes": {
                "folders": [folder_record("f_notes", "Notes"), folder_record("f_lists", "Lists")],
                "notes": notes,
            }
        },
        checks=[
            *(
                Check(
                    name=f"{item} on the list, unticked",
                    target="notes.notes",
                    where={"id": "n_301", "checklist__contains": {"text": item, "done": False}},
                )
                for item in wanted
            ),
            Check(
                name="body left alone", target="notes.notes", where={"id": "n_301", "body": body}
            ),
            Check(
                name="other lists untouched",
                target="notes.notes",
                where={"id": "n_302", "checklist": hardware},
            ),
        ],
        plan=plan,
        difficulty=3 if revive else 2,
    )


PROJECTS = [
    (
        "Plan {n}'s birthday party",
        ["Book the venue", "Send invitations", "Order the cake", "Buy decorations"],
    ),
    (
        "Move {n} into the new flat",
        ["Book the van", "Pack the kitchen", "Forward the mail", "Return the old keys"],
    ),
    (
        "Organise {n}'s visa",
        ["Fill in the form", "Get passport photos", "Book the appointment", "Pay the fee"],
    ),
    ("Sell {n}'s old bike", ["Take photos", "Post the ad", "Meet the buyer", "Hand over the lock"]),
    (
        "Plan the trip with {n}",
        ["Book flights", "Reserve the hotel", "Buy travel insurance", "Print tickets"],
    ),
    (
        "Redecorate {n}'s room",
        ["Pick the paint", "Buy brushes", "Move the furniture", "Paint the walls"],
    ),
]
DONE_PHRASES = [
    "I've finished '{p}' — tick it off in Reminders.",
    "Mark '{p}' as done in my reminders.",
    "'{p}' is all wrapped up; complete it in Reminders.",
]


@template(domain="notes", capabilities=["skills"], apps=["reminders"], difficulty=3)
def complete_project_with_subtasks(g: TaskGen) -> Any:
    (pattern, steps), (other_pattern, other_steps) = g.rng.sample(PROJECTS, 2)
    who, other_who = g.rng.sample(FIRST, 2)
    project, other_project = pattern.format(n=who), other_pattern.format(n=other_who)
    names = g.rng.sample(LIST_NAMES, 2)
    lid = f"rl_{names[0].lower()}"
    chosen = g.rng.sample(steps, 3)
    already = g.rng.random() < 0.5
    rows = [reminder_record("r_500", project, lid, due="2026-03-06T18:00", priority="high")]
    open_ids = []
    for i, step in enumerate(chosen):
        rid = f"r_50{i + 1}"
        closed = already and i == 0
        rows.append(reminder_record(rid, step, lid, parent_id="r_500", completed=closed))
        if not closed:
            open_ids.append(rid)
    rows.append(reminder_record("r_510", other_project, lid, due="2026-03-09T18:00"))
    for i, step in enumerate(g.rng.sample(other_steps, 2)):
        rows.append(reminder_record(f"r_51{i + 1}", step, lid, parent_id="r_510"))
    for i, chore in enumerate(g.rng.sample(CHORES, 3)):
        rows.append(
            reminder_record(f"r_52{i}", chore, f"rl_{names[1].lower()}", due="2026-03-04T12:00")
        )
    before = sum(1 for r in rows if r["completed"])
    phrase = g.rng.choice(DONE_PHRASES).format(p=project)
    return g.task(
        instruction=phrase,
        world={"reminders": {"lists": _lists(names), "reminders": rows}},
        checks=[
            Check(
                name="project completed",
                target="reminders.reminders",
                where={"id": "r_500", "completed": True},
            ),
            *(
                Check(
                    name=f"subtask {rid} completed",
                    target="reminders.reminders",
                    where={"id": rid, "completed": True},
                )
                for rid in open_ids
            ),
            Check(
                name="nothing else completed",
                target="reminders.reminders",
                op="count",
                where={"completed": True},
                expect=before + len(open_ids) + 1,
            ),
        ],
        plan=[
            ToolCall(tool="reminders_search", arguments={"query": project}),
            ToolCall(tool="reminders_list", arguments={"parent_id": "${0.0.id}"}),
            *(
                ToolCall(
                    tool="reminders_complete", arguments={"reminder_id": f"${{1.reminders.{i}.id}}"}
                )
                for i in range(len(open_ids))
            ),
            ToolCall(tool="reminders_complete", arguments={"reminder_id": "r_500"}),
            Finish(),
        ],
    )


# --------------------------------------------------------------------------- memory

TODO = [
    ("pay the water bill", "water bill", "bills"),
    ("renew the car insurance", "car insurance", "bills"),
    ("cancel the magazine subscription", "magazine", "bills"),
    ("book a haircut", "haircut", "errands"),
    ("pick up the dry cleaning", "dry cleaning", "errands"),
    ("return the library books", "library books", "errands"),
    ("refill my prescription", "prescription", "health"),
    ("book the dentist check-up", "dentist", "health"),
    ("send the invoice to Acme", "invoice", "work"),
    ("submit the expense report", "expense report", "work"),
    ("call the plumber", "plumber", "home"),
    ("replace the smoke alarm battery", "smoke alarm", "home"),
]
CATEGORY_LISTS = {
    "bills": ("Bills", "Finance"),
    "errands": ("Errands", "Shopping"),
    "health": ("Health", "Personal"),
    "work": ("Work", "Office"),
    "home": ("Home", "House"),
}


@template(domain="notes", capabilities=["memory"], apps=["reminders"], difficulty=2)
def remind_with_usual_list_and_time(g: TaskGen) -> Any:
    task, keyword, category = g.rng.choice(TODO)
    right_list, wrong_list = g.rng.sample(CATEGORY_LISTS[category], 2)
    right_time, wrong_time = g.rng.sample(
        ["07:30", "08:00", "09:00", "12:30", "18:00", "19:30", "20:00"], 2
    )
    day = g.rng.choice(WORKDAYS)
    memory: list[MemoryItem] = [
        *recall(g.rng, f"{category}_reminders_list", right_list, wrong_list),
        *recall(
            g.rng,
            "default_reminder_time",
            right_time,
            wrong_time,
            noise=[("default_alarm_sound", "Harp")],
        ),
    ]
    g.rng.shuffle(memory)
    names = sorted({*CATEGORY_LISTS[category], *g.rng.sample(LIST_NAMES, 2)})
    lists = [list_record(f"rl_{n.lower()}", n) for n in names]
    rows = [
        reminder_record(f"r_{601 + i}", chore, g.rng.choice(lists)["id"], due="2026-03-05T18:00")
        for i, chore in enumerate(g.rng.sample(CHORES, 4))
    ]
    rid = f"rl_{right_list.lower()}"
    due = f"{day:%Y-%m-%d}T{right_time}"
    return g.task(
        instruction=(
            f"Remind me to {task} on {day_phrase(day)} — put it in the list I use for {category} "
            "stuff, at my usual reminder time."
        ),
        world={"reminders": {"lists": lists, "reminders": rows}},
        checks=[
            Check(
                name="reminder in the usual list at the usual time",
                target="reminders.reminders",
                where={"title__icontains": keyword, "list_id": rid, "due": due},
            ),
            Check(
                name="added once",
                target="reminders.reminders",
                op="count",
                where={"title__icontains": keyword},
                expect=1,
            ),
        ],
        plan=[
            ToolCall(tool="reminders_list_lists", arguments={}),
            ToolCall(
                tool="reminders_create",
                arguments={"list_id": rid, "title": task[0].upper() + task[1:], "due": due},
            ),
            Finish(),
        ],
        memory=memory,
    )


IDEA_NOTES = [
    (
        "gift ideas",
        ("Gift ideas", "Presents 2025"),
        [
            "a silk scarf",
            "noise-cancelling earbuds",
            "a pottery class",
            "a plant stand",
            "a star map print",
            "a chess set",
            "a cookbook",
            "a fountain pen",
        ],
    ),
    (
        "reading",
        ("Books to read", "Reading list 2024"),
        [
            "Piranesi by Susanna Clarke",
            "The Overstory by Richard Powers",
            "Circe by Madeline Miller",
            "Educated by Tara Westover",
            "Stoner by John Williams",
            "Middlemarch by George Eliot",
            "The Dispossessed by Ursula Le Guin",
            "Pachinko by Min Jin Lee",
        ],
    ),
    (
        "recipes",
        ("Recipes to try", "Dinner ideas (old)"),
        [
            "miso aubergine",
            "green shakshuka",
            "dal makhani",
            "lemon risotto",
            "dolsot bibimbap",
            "pumpkin gnocchi",
            "fish tacos",
            "ramen eggs",
        ],
    ),
    (
        "podcast",
        ("Podcast picks", "Shows to hear"),
        [
            "Hidden Brain",
            "Radiolab from WNYC",
            "99% Invisible",
            "Song Exploder",
            "Reply All",
            "Freakonomics Radio",
            "The Daily",
            "Planet Money",
        ],
    ),
    (
        "travel",
        ("Trip ideas", "Travel bucket list"),
        [
            "Lofoten in winter",
            "the Azores",
            "Kyoto in autumn",
            "the Dolomites",
            "Oaxaca in November",
            "Tbilisi wine bars",
            "the Faroe Islands",
            "Porto by train",
        ],
    ),
    (
        "film",
        ("Movies to watch", "Film list 2023"),
        [
            "Past Lives",
            "Aftersun by Charlotte Wells",
            "Perfect Days",
            "Paterson by Jim Jarmusch",
            "Roma by Alfonso Cuaron",
            "Drive My Car",
            "Minari by Lee Isaac Chung",
            "The Farewell",
        ],
    ),
]


@template(domain="notes", capabilities=["memory", "tool_use"], apps=["notes"], difficulty=3)
def append_to_usual_note(g: TaskGen) -> Any:
    topic, titles, ideas = g.rng.choice(IDEA_NOTES)
    right, wrong = g.rng.sample(list(titles), 2)
    others = [i for i in ideas]
    g.rng.shuffle(others)
    idea = others.pop()
    slug = topic.replace(" ", "_")
    memory = recall(g.rng, f"{slug}_note", right, wrong, noise=[("notes_default_folder", "Notes")])
    notes = [
        note_record("n_701", right, "\n".join(others[:3])),
        note_record("n_702", wrong, "\n".join(others[3:6])),
        *(note_record(f"n_71{i}", t, b) for i, (t, b, _) in enumerate(_note_kinds(g)[:4])),
    ]
    g.rng.shuffle(notes)
    return g.task(
        instruction=f"Add {idea} to my usual {topic} note.",
        world={"notes": {"folders": [folder_record("f_notes", "Notes")], "notes": notes}},
        checks=[
            Check(
                name="added to the remembered note",
                target="notes.notes",
                where={"id": "n_701", "body__icontains": idea},
            ),
            Check(
                name="not added to the stale note",
                target="notes.notes",
                op="absent",
                where={"id": "n_702", "body__icontains": idea},
            ),
            Check(
                name="no new note", target="notes.notes", op="count", where={}, expect=len(notes)
            ),
        ],
        plan=[
            ToolCall(tool="notes_search", arguments={"query": right}),
            ToolCall(tool="notes_append", arguments={"note_id": "${0.0.id}", "text": idea}),
            Finish(),
        ],
        memory=memory,
    )


# --------------------------------------------------------------------------- subagent

DIGEST_TITLES = ["Open items", "To-do digest", "Loose ends", "Still to do", "Catch-up list"]


@template(domain="notes", capabilities=["subagent"], apps=["reminders", "notes"], difficulty=4)
def digest_open_reminders(g: TaskGen) -> Any:
    l1, l2, l3 = g.rng.sample(LIST_NAMES, 3)
    chores = g.rng.sample(CHORES, 12)
    rows: list[dict[str, Any]] = []
    open_items: dict[str, list[str]] = {}
    closed: list[str] = []
    for k, name in enumerate((l1, l2, l3)):
        n_open = g.rng.choice([2, 3])
        picked, chores = chores[: n_open + 1], chores[n_open + 1 :]
        lid = f"rl_{name.lower()}"
        for i, title in enumerate(picked):
            done = i == n_open
            rows.append(
                reminder_record(
                    f"r_8{k}{i}", title, lid, completed=done, due=f"2026-03-0{3 + i}T18:00"
                )
            )
            if done:
                closed.append(title)
            else:
                open_items.setdefault(name, []).append(title)
    wanted = open_items[l1] + open_items[l2]
    unwanted = closed + open_items[l3]
    day = g.rng.choice(WORKDAYS)
    title = f"{g.rng.choice(DIGEST_TITLES)} ({day:%b} {day.day})"

    def scout(name: str, agent: str) -> list[Any]:
        return [
            Delegate(
                goal=f"List the open reminders in my '{name}' list",
                tools=["reminders_list_lists", "reminders_list"],
                agent=agent,
            ),
            ToolCall(tool="reminders_list", arguments={"list_id": f"rl_{name.lower()}"}),
            Finish(answer="; ".join(open_items[name])),
        ]

    return g.task(
        instruction=(
            f"Collect every open reminder from my '{l1}' and '{l2}' lists into a new note titled "
            f"'{title}', one per line."
        ),
        world={
            "reminders": {"lists": _lists([l1, l2, l3]), "reminders": rows},
            "notes": {"folders": [folder_record("f_notes", "Notes")], "notes": []},
        },
        checks=[
            *(
                Check(
                    name=f"'{t}' collected",
                    target="notes.notes",
                    where={"title": title, "body__icontains": t},
                )
                for t in wanted
            ),
            *(
                Check(
                    name=f"'{t}' left out",
                    target="notes.notes",
                    op="absent",
                    where={"title": title, "body__icontains": t},
                )
                for t in unwanted
            ),
            Check(
                name="one digest note",
                target="notes.notes",
                op="count",
                where={"title": title},
                expect=1,
            ),
        ],
        plan=[
            ToolCall(tool="reminders_list_lists", arguments={}),
            *scout(l1, "list_a"),
            *scout(l2, "list_b"),
            ToolCall(tool="notes_create", arguments={"title": title, "body": "\n".join(wanted)}),
            Finish(),
        ],
        difficulty=4 if len(wanted) <= 5 else 5,
    )


REQUESTS = [
    ("return my drill", "drill"),
    ("send me the lease PDF", "lease"),
    ("book the tennis court for Saturday", "tennis court"),
    ("pick up the concert tickets", "concert tickets"),
    ("bring back my camping stove", "camping stove"),
    ("water my plants while I'm away", "plants"),
    ("review my CV", "CV"),
    ("forward the wedding photos", "wedding photos"),
    ("order the team t-shirts", "t-shirts"),
    ("check flight prices for June", "flight prices"),
    ("return the ladder", "ladder"),
    ("sign the card for Grandma", "card for Grandma"),
]
SMALL_TALK = [
    "Hey! How was the weekend?",
    "Great seeing you yesterday.",
    "Did you get home ok?",
    "Loved the photos!",
]


def _thread(person: dict[str, Any], texts: list[str], first_id: int) -> list[dict[str, Any]]:
    return [
        message_record(
            f"m_{first_id + i}",
            person["phone"],
            text,
            f"2026-03-01T{10 + i:02d}:{first_id % 50:02d}",
        )
        for i, text in enumerate(texts)
    ]


@template(
    domain="notes",
    capabilities=["subagent", "tool_use"],
    apps=["reminders", "contacts", "messaging"],
    difficulty=4,
)
def reminders_from_two_threads(g: TaskGen) -> Any:
    people = contacts_world(g.fake, 7, favorite_rate=0.25)
    a, b, c = g.rng.sample(people, 3)
    (ask_a, kw_a), (ask_b, kw_b), (ask_c, kw_c) = g.rng.sample(REQUESTS, 3)
    l1, l2, l3 = g.rng.sample(["Home", "Work", "Errands", "Personal"], 3)
    messages = [
        *_thread(a, [g.rng.choice(SMALL_TALK), f"Could you {ask_a}? Thanks!"], 201),
        *_thread(b, [g.rng.choice(SMALL_TALK), f"Also, can you {ask_b}?"], 211),
        *_thread(c, [f"Would you {ask_c}?"], 221),
    ]
    day = g.rng.choice(WORKDAYS)
    due = f"{day:%Y-%m-%d}T{g.rng.choice(DUE_TIMES)}"

    def reader(person: dict[str, Any], answer: str, agent: str, at: int) -> list[Any]:
        return [
            Delegate(
                goal=f"Find what {person['name']} asked me to do in their texts",
                tools=["contacts_search", "messaging_read_thread"],
                agent=agent,
            ),
            ToolCall(tool="contacts_search", arguments={"query": person["name"]}),
            ToolCall(tool="messaging_read_thread", arguments={"phone": f"${{{at + 1}.0.phone}}"}),
            Finish(answer=answer),
        ]

    id1, id2 = f"rl_{l1.lower()}", f"rl_{l2.lower()}"
    return g.task(
        instruction=(
            f"{a['name']} and {b['name']} each texted me something they need. Add {a['name']}'s "
            f"request to my '{l1}' reminders and {b['name']}'s to '{l2}', both due "
            f"{day_phrase(day)} at {due[-5:]}."
        ),
        world={
            "reminders": {"lists": _lists([l1, l2, l3]), "reminders": []},
            "contacts": {"contacts": people},
            "messaging": {"messages": messages},
        },
        checks=[
            Check(
                name=f"{a['name']}'s request",
                target="reminders.reminders",
                where={"list_id": id1, "title__icontains": kw_a, "due": due},
            ),
            Check(
                name=f"{b['name']}'s request",
                target="reminders.reminders",
                where={"list_id": id2, "title__icontains": kw_b, "due": due},
            ),
            Check(
                name="just the two", target="reminders.reminders", op="count", where={}, expect=2
            ),
            Check(
                name="third sender ignored",
                target="reminders.reminders",
                op="absent",
                where={"title__icontains": kw_c},
            ),
        ],
        plan=[
            *reader(a, ask_a, "reader_a", 0),
            *reader(b, ask_b, "reader_b", 4),
            ToolCall(tool="reminders_list_lists", arguments={}),
            ToolCall(
                tool="reminders_create",
                arguments={"list_id": id1, "title": ask_a.capitalize(), "due": due},
            ),
            ToolCall(
                tool="reminders_create",
                arguments={"list_id": id2, "title": ask_b.capitalize(), "due": due},
            ),
            Finish(),
        ],
    )
