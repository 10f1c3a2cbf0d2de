"""Parsing model output into actions: every form the models write, and every way it goes wrong."""

from __future__ import annotations

import json
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qpa.contract import (
    Delegate,
    ErrorKind,
    Finish,
    MessageUser,
    ToolCall,
    ToolSpec,
    UIAction,
)
from qpa.harness.backends.base import ChatMessage, Completion, RawToolCall, to_text_protocol
from qpa.harness.parsing import (
    PSEUDO_TOOLS,
    ParseFailure,
    format_tool_call,
    parse_completion,
    render_tool_protocol,
    with_pseudo_tools,
)

TOOLS = [
    ToolSpec(
        name="contacts_search",
        description="Find contacts by name.",
        app="contacts",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="messaging_send",
        description="Send a text message.",
        app="messaging",
        side_effect="write",
        parameters={
            "type": "object",
            "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
            "required": ["to", "text"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(name="messaging_list_threads", description="List threads.", app="messaging"),
]


def native(name: str, arguments: str, call_id: str = "call_1", text: str = "") -> Completion:
    return Completion(
        text=text, tool_calls=[RawToolCall(id=call_id, name=name, arguments=arguments)]
    )


def failure(result: object, kind: str) -> ParseFailure:
    assert isinstance(result, ParseFailure), result
    assert result.kind == kind, result
    return result


# --------------------------------------------------------------------------- native calls


def test_native_tool_call_becomes_a_tool_call_with_its_id() -> None:
    action = parse_completion(native("contacts_search", '{"query": "Ana"}', "c7"), TOOLS)
    assert action == ToolCall(tool="contacts_search", arguments={"query": "Ana"}, call_id="c7")


def test_native_empty_arguments_mean_no_arguments() -> None:
    action = parse_completion(native("messaging_list_threads", ""), TOOLS)
    assert action == ToolCall(tool="messaging_list_threads", arguments={}, call_id="call_1")


def test_native_first_call_wins_and_function_prefix_is_tolerated() -> None:
    completion = Completion(
        tool_calls=[
            RawToolCall(id="a", name="functions.contacts_search", arguments='{"query": "Bo"}'),
            RawToolCall(id="b", name="messaging_send", arguments="{}"),
        ]
    )
    action = parse_completion(completion, TOOLS)
    assert isinstance(action, ToolCall)
    assert (action.tool, action.call_id) == ("contacts_search", "a")


def test_native_arguments_that_are_not_json_are_malformed() -> None:
    result = failure(
        parse_completion(native("contacts_search", "{query: Ana"), TOOLS), "malformed_output"
    )
    assert "contacts_search" in result.message and "not JSON" in result.message
    assert result.call_id == "call_1" and result.tool == "contacts_search"
    assert "{query: Ana" in result.raw


@pytest.mark.parametrize("arguments", ['["Ana"]', '"Ana"', "42", "null ["])
def test_native_arguments_that_are_not_an_object_are_malformed(arguments: str) -> None:
    failure(parse_completion(native("contacts_search", arguments), TOOLS), "malformed_output")


def test_unknown_tool_names_close_matches() -> None:
    result = failure(
        parse_completion(native("contact_search", '{"query": "x"}'), TOOLS), "unknown_tool"
    )
    assert "contact_search" in result.message
    assert "did you mean 'contacts_search'" in result.message
    assert result.tool == "contact_search"


def test_hallucinated_and_missing_arguments_are_invalid() -> None:
    result = failure(
        parse_completion(native("messaging_send", '{"to": "+1", "txt": "hi"}'), TOOLS),
        "invalid_arguments",
    )
    assert "'txt'" in result.message and "'text' is a required property" in result.message
    result = failure(
        parse_completion(native("contacts_search", '{"query": "Bo", "limit": "ten"}'), TOOLS),
        "invalid_arguments",
    )
    assert "argument 'limit'" in result.message


def test_schema_validation_can_be_left_to_the_environment() -> None:
    action = parse_completion(
        native("messaging_send", '{"to": "+1", "txt": "hi"}'), TOOLS, validate_arguments=False
    )
    assert action == ToolCall(
        tool="messaging_send", arguments={"to": "+1", "txt": "hi"}, call_id="call_1"
    )


# --------------------------------------------------------------------------- pseudo-tools


def test_pseudo_tools_become_harness_actions() -> None:
    assert parse_completion(native("finish", '{"answer": "Ana"}'), TOOLS) == Finish(answer="Ana")
    assert parse_completion(native("finish", "{}"), TOOLS) == Finish(answer=None)
    assert parse_completion(native("finish", '{"answer": 3}'), TOOLS) == Finish(answer="3")
    assert parse_completion(native("message_user", '{"text": "Which Ana?"}'), TOOLS) == MessageUser(
        text="Which Ana?"
    )
    delegate = parse_completion(
        native("delegate", '{"goal": "find Ana", "tools": ["contacts_search"], "agent": "finder"}'),
        TOOLS,
    )
    assert delegate == Delegate(goal="find Ana", tools=["contacts_search"], agent="finder")
    assert parse_completion(native("delegate", '{"goal": "g"}'), TOOLS) == Delegate(goal="g")


def test_pseudo_tools_are_checked_too() -> None:
    failure(parse_completion(native("message_user", "{}"), TOOLS), "invalid_arguments")
    failure(
        parse_completion(native("finish", '{"answer": "x", "why": 1}'), TOOLS), "invalid_arguments"
    )
    result = failure(
        parse_completion(native("delegate", '{"goal": "g", "tools": ["teleport"]}'), TOOLS),
        "invalid_arguments",
    )
    assert "teleport" in result.message
    # even when schema validation of real tools is off, no invalid action is ever built
    failure(
        parse_completion(native("message_user", "{}"), TOOLS, validate_arguments=False),
        "invalid_arguments",
    )


# --------------------------------------------------------------------------- text protocol


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "contacts_search", "arguments": {"query": "Ana"}}</tool_call>',
        '  <tool_call>\n  {"name": "contacts_search",\n "arguments": {"query": "Ana"}}\n'
        "</tool_call>  ",
        'I will search.\n<tool_call>\n```json\n{"name": "contacts_search", "arguments": '
        '{"query": "Ana"}}\n```\n</tool_call>',
        '<tool_call>{"name": "contacts_search", "arguments": {"query": "Ana"}}',  # cut at stop
        '<tool_call>{"name": "contacts_search", "arguments": "{\\"query\\": \\"Ana\\"}"}'
        "</tool_call>",
        '<tool_call>{"name": "contacts_search", "parameters": {"query": "Ana"}}</tool_call>',
        '{"name": "contacts_search", "arguments": {"query": "Ana"}}',
        '```json\n{"name": "contacts_search", "arguments": {"query": "Ana"}}\n```',
        'Searching now: {"name": "contacts_search", "arguments": {"query": "Ana"}} then reply',
        '{"type": "tool_call", "tool": "contacts_search", "arguments": {"query": "Ana"}}',
        '{"function": {"name": "contacts_search", "arguments": {"query": "Ana"}}}',
        '<think>Maybe <tool_call>{"name": "messaging_send"}</tool_call>?</think>\n'
        '<tool_call>{"name": "contacts_search", "arguments": {"query": "Ana"}}</tool_call>',
        'the opening tag was in the prompt</think><tool_call>{"name": "contacts_search", '
        '"arguments": {"query": "Ana"}}</tool_call>',
    ],
)
def test_text_forms_of_a_tool_call(text: str) -> None:
    action = parse_completion(Completion(text=text), TOOLS)
    assert isinstance(action, ToolCall), action
    assert (action.tool, action.arguments) == ("contacts_search", {"query": "Ana"})


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("<finish>Ana Lima</finish>", "Ana Lima"),
        ("Done.\n<finish>\n  Ana Lima \n</finish>", "Ana Lima"),
        ("<finish></finish>", None),
        ("<finish/>", None),
        ("<finish>Ana Lima", "Ana Lima"),
        ('{"type": "finish", "answer": "Ana Lima"}', "Ana Lima"),
        (
            '<tool_call>{"name": "finish", "arguments": {"answer": "Ana Lima"}}</tool_call>',
            "Ana Lima",
        ),
        ('<finish>Ana Lima</finish> <tool_call>{"name": "messaging_send"}</tool_call>', "Ana Lima"),
    ],
)
def test_text_forms_of_finish(text: str, answer: str | None) -> None:
    assert parse_completion(text, TOOLS) == Finish(answer=answer)


def test_contract_actions_as_bare_json() -> None:
    assert parse_completion('{"type": "ui", "op": "tap", "x": 3, "y": 4}', TOOLS) == UIAction(
        op="tap", x=3, y=4
    )
    failure(parse_completion('{"type": "ui", "op": "fly"}', TOOLS), "invalid_arguments")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n ",
        "I think I should search for Ana next.",
        "<tool_call>{name: contacts_search}</tool_call>",
        "<tool_call>not json at all</tool_call>",
        '<tool_call>["contacts_search", {"query": "Ana"}]</tool_call>',
        '<tool_call>{"arguments": {"query": "Ana"}}</tool_call>',
        '<tool_call>{"name": "contacts_search", "arguments": [1, 2]}</tool_call>',
        '<tool_call>{"name": "contacts_search", "arguments": "query=Ana"}</tool_call>',
        "{ this is prose with braces }",
        "<think>I will call contacts_search</think>",
        '<think>{"name": "contacts_search", "arguments": {"query": "Ana"}}',  # never finished
    ],
)
def test_malformed_text_is_a_parse_failure(text: str) -> None:
    result = failure(parse_completion(Completion(text=text), TOOLS), "malformed_output")
    assert result.message
    assert result.raw == text


def test_text_unknown_tool_and_bad_arguments() -> None:
    result = failure(
        parse_completion('<tool_call>{"name": "send_sms", "arguments": {}}</tool_call>', TOOLS),
        "unknown_tool",
    )
    assert "send_sms" in result.message and "messaging_send" in result.message
    failure(
        parse_completion(
            '<tool_call>{"name": "messaging_send", "arguments": {"to": "+1"}}</tool_call>', TOOLS
        ),
        "invalid_arguments",
    )


def test_parse_failure_becomes_error_feedback() -> None:
    result = failure(parse_completion("no idea", TOOLS), "malformed_output")
    feedback = result.feedback()
    assert feedback.status == "error"
    assert feedback.error in get_args(ErrorKind)
    assert feedback.error == "malformed_action"
    assert "no tool call found" in feedback.message
    assert result.annotation()["kind"] == "malformed_output"
    unknown = failure(parse_completion(native("nope", "{}"), TOOLS), "unknown_tool").feedback()
    assert unknown.error == "unknown_tool"


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list('<>{}[]":, \n/_abcfhilnostuwy0123456789`')), max_size=80)
)
def test_parser_never_raises(text: str) -> None:
    result = parse_completion(text, TOOLS)
    assert isinstance(result, ParseFailure | ToolCall | Finish | MessageUser | Delegate | UIAction)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40), st.text(max_size=200))
def test_parser_never_raises_on_native_calls(name: str, arguments: str) -> None:
    parse_completion(native(name, arguments), TOOLS)


# --------------------------------------------------------------------------- rendering


def test_render_tool_protocol_describes_tools_and_the_calling_convention() -> None:
    prompt = render_tool_protocol(TOOLS)
    for tool in with_pseudo_tools(TOOLS):
        assert f'"name": "{tool.name}"' in prompt
    assert json.dumps(TOOLS[0].parameters) in prompt
    assert "<tool_call>" in prompt and "</tool_call>" in prompt
    assert "<finish>" in prompt and "<tool_response>" in prompt
    assert (
        "finish"
        not in render_tool_protocol([], include_pseudo=False)
        .split("<tools>")[1]
        .split("</tools>")[0]
    )


def test_with_pseudo_tools_does_not_duplicate() -> None:
    tools = with_pseudo_tools([*TOOLS, PSEUDO_TOOLS[0]])
    assert [t.name for t in tools].count("finish") == 1
    assert {t.name for t in tools} >= {"finish", "message_user", "delegate", "messaging_send"}


def test_formatted_tool_call_round_trips() -> None:
    text = format_tool_call("messaging_send", '{"to": "+1", "text": "hi"}')
    assert parse_completion(text, TOOLS) == ToolCall(
        tool="messaging_send", arguments={"to": "+1", "text": "hi"}
    )


def test_to_text_protocol_flattens_native_history() -> None:
    messages = [
        ChatMessage.system("You are a phone agent."),
        ChatMessage.user("Text Ana hi"),
        ChatMessage.assistant(
            "Searching.",
            [RawToolCall(id="c1", name="contacts_search", arguments='{"query": "Ana"}')],
        ),
        ChatMessage.tool(
            [{"name": "Ana", "phone": "+1"}], tool_call_id="c1", name="contacts_search"
        ),
        ChatMessage.tool({"ok": True}, tool_call_id="c2"),
        ChatMessage.assistant("<finish>done</finish>"),
    ]
    flat = to_text_protocol(messages, TOOLS)
    assert [m.role for m in flat] == ["system", "user", "assistant", "user", "assistant"]
    assert flat[0].content is not None and flat[0].content.startswith("You are a phone agent.")
    assert "<tools>" in flat[0].content
    assert flat[2].content is not None and "<tool_call>" in flat[2].content
    assert parse_completion(flat[2].content.split("Searching.\n", 1)[1], TOOLS) == ToolCall(
        tool="contacts_search", arguments={"query": "Ana"}
    )
    assert flat[3].content is not None and flat[3].content.count("<tool_response>") == 2
    assert all(not m.tool_calls and m.tool_call_id is None for m in flat)
    # no system message: the protocol becomes one
    assert to_text_protocol([ChatMessage.user("hi")], TOOLS)[0].role == "system"


def test_chat_message_to_openai() -> None:
    call = RawToolCall(id="c1", name="contacts_search", arguments='{"query": "Ana"}')
    assert ChatMessage.assistant(None, [call]).to_openai() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "contacts_search", "arguments": call.arguments},
            }
        ],
    }
    assert ChatMessage.tool("ok", tool_call_id="c1").to_openai() == {
        "role": "tool",
        "content": "ok",
        "tool_call_id": "c1",
    }
