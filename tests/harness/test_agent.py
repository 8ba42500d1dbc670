"""The agent loop: tool turns, parallel calls, malformed calls, limits, self-summarization,
saving after every step, token-level records, and trajectory serialisation."""

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from opencomposer.engine.client import ChatResult, InProcessClient, Usage
from opencomposer.engine.fake import FakeEngine, assistant_reply
from opencomposer.harness.agent import Agent, AgentConfig, ChatClientPolicy, ChatReply, TokenClientPolicy
from opencomposer.harness.trajectory import Prices, Trajectory, read_jsonl, write_jsonl
from opencomposer.model.chat import SUMMARY_PREFIX, encode_messages, encode_turn
from opencomposer.model.tokenizer import END, bundled_tokenizer
from opencomposer.sandbox.base import ExecResult
from opencomposer.tasks.policies import ScriptedPolicy, ScriptedTokenPolicy, text_to_ids


class FakeWorkspace:
    """A directory plus a terminal whose commands each wait until `expected` are running at once,
    so calls run one by one would time out instead of finishing."""

    def __init__(self, root, expected=1):
        self.root = Path(root)
        self.running, self.expected = 0, expected
        self.all_in = asyncio.Event()
        self.commands = []

    async def aexec(self, cmd, *, limits=None, **_):
        self.commands.append(cmd)
        self.running += 1
        if self.running >= self.expected:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 5)
        self.running -= 1
        return ExecResult(0, f"ran {cmd}\n", "")


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    return FakeWorkspace(tmp_path)


@pytest.fixture(scope="module")
def tok():
    return bundled_tokenizer()


def call(name, id="c0", **args):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def reply(*calls, content=""):
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


FINAL = {"role": "assistant", "content": "All done."}


async def test_tool_turn_then_final_answer(ws):
    policy = ScriptedPolicy([reply(call("edit_file", path="a.py", old_string="x = 1", new_string="x = 2")), FINAL])
    t = await Agent(policy, ws).run("Set x to 2.")
    assert (ws.root / "a.py").read_text() == "x = 2\n"
    assert t.stop_reason == "final" and t.final_message == "All done."
    roles = [m["role"] for m in t.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert t.messages[1]["content"] == "Set x to 2."
    assert t.messages[3]["tool_call_id"] == "c0" and "Edited a.py" in t.messages[3]["content"]
    assert [k.kind for k in t.turns] == ["action", "final"]
    assert t.counts.turns == 2 and t.counts.tool_calls == 1 and t.counts.tool_errors == 0
    assert t.counts.final_message_tokens > 0 and t.counts.tool_output_tokens > 0
    # the policy saw the tool schemas and the growing conversation
    assert [len(m) for m in policy.seen] == [2, 4]
    assert t.tools[0]["function"]["name"] == "read_file"


async def test_one_turns_calls_run_in_parallel_and_results_keep_call_order(tmp_path):
    ws = FakeWorkspace(tmp_path, expected=3)
    calls = [call("run_terminal_cmd", id=f"c{i}", command=f"echo {i}") for i in range(3)]
    t = await Agent(ScriptedPolicy([reply(*calls), FINAL]), ws).run("go")
    tool_msgs = [m for m in t.messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["c0", "c1", "c2"]
    assert all(f"ran echo {i}" in m["content"] for i, m in enumerate(tool_msgs))
    assert all(r.ok for r in t.tool_calls) and t.stop_reason == "final"


async def test_bad_tool_calls_come_back_as_tool_errors(ws):
    bad_json = {"id": "b0", "type": "function", "function": {"name": "read_file", "arguments": "{path: a.py"}}
    policy = ScriptedPolicy([reply(bad_json, call("no_such_tool", id="b1"), call("read_file", id="b2", path="a.py")),
                             FINAL])
    t = await Agent(policy, ws).run("look")
    assert t.stop_reason == "final"
    kinds = [r.error_kind for r in t.tool_calls]
    assert kinds == ["invalid_json", "unknown_tool", None]
    tool_msgs = [m for m in t.messages if m["role"] == "tool"]
    assert tool_msgs[0]["content"].startswith("Error: ") and "x = 1" in tool_msgs[2]["content"]
    assert t.counts.malformed_calls == 1 and t.counts.tool_errors == 2


@pytest.mark.parametrize("config, reason", [
    (AgentConfig(max_turns=3), "max_turns"),
    (AgentConfig(max_total_tokens=30), "max_tokens"),
])
async def test_limits_end_the_episode_with_their_stop_reason(ws, config, reason):
    looping = ScriptedPolicy([reply(call("read_file", path="a.py"))] * 50)
    t = await Agent(looping, ws, config).run("loop")
    assert t.stop_reason == reason
    if reason == "max_turns":
        assert t.counts.turns == 3
    else:
        assert 30 <= t.counts.completion_tokens < 30 + t.turns[-1].completion_tokens


async def test_max_tool_errors_ends_the_episode_after_that_many_failed_calls(ws):
    bad_json = {"id": "b0", "type": "function", "function": {"name": "read_file", "arguments": "{path"}}
    policy = ScriptedPolicy([reply(call("read_file", path="a.py")), reply(call("read_file", path="missing.py")),
                             reply(bad_json), FINAL])
    t = await Agent(policy, ws, AgentConfig(max_tool_errors=2)).run("look")
    assert t.stop_reason == "tool_errors" and t.counts.turns == 3 and t.counts.tool_errors == 2
    assert t.messages[-1]["role"] == "tool" and t.messages[-1]["content"].startswith("Error: ")  # the model's view
    t = await Agent(ScriptedPolicy([reply(call("read_file", path="missing.py")), FINAL]), ws).run("look")
    assert t.stop_reason == "final"  # no limit by default


async def test_wall_time_interrupts_a_slow_policy_call(ws):
    class Slow(ScriptedPolicy):
        async def chat(self, messages, tools):
            await asyncio.sleep(30)
            return FINAL

    t = await Agent(Slow([]), ws, AgentConfig(max_wall_s=0.3)).run("wait")
    assert t.stop_reason == "wall_time" and t.counts.turns == 0


def start_tokens(tok, ws, instruction):
    """Tokens of the first context (system prompt with tool schemas + task)."""
    probe = Agent(ScriptedPolicy([]), ws)
    return len(encode_messages(tok, [{"role": "system", "content": probe.config.system_prompt},
                                     {"role": "user", "content": instruction}], probe.tools))


async def test_context_full_when_no_room_is_left(ws, tok):
    policy = ScriptedPolicy([reply(call("read_file", path="a.py"))] * 5)
    config = AgentConfig(context_window=start_tokens(tok, ws, "go") + 30, summarize_at=None)
    t = await Agent(policy, ws, config).run("go")
    assert t.stop_reason == "context_full" and t.counts.turns == 1


async def test_an_engine_out_of_context_ends_the_episode(ws, tok):
    engine = FakeEngine(replies=[assistant_reply(tok, "never")], max_len=64)  # prompt alone is longer
    t = await Agent(TokenClientPolicy(InProcessClient(engine, tok), tok), ws).run("go")
    assert t.stop_reason == "context_full" and len(engine.requests) == 1


async def test_self_summarization_continues_in_a_fresh_context(ws, tok):
    (ws.root / "big.txt").write_text("lorem ipsum dolor\n" * 80)
    seen_request = []

    def summarize(messages):
        seen_request.append(messages[-1]["content"])
        return {"role": "assistant", "content": "SUMMARY: read big.txt, nothing left."}

    policy = ScriptedPolicy([reply(call("read_file", path="big.txt")), summarize, FINAL])
    start = start_tokens(tok, ws, "Read big.txt.")
    t = await Agent(policy, ws, AgentConfig(summarize_at=start + 100)).run("Read big.txt.")
    assert t.stop_reason == "final" and t.counts.summaries == 1
    assert "summary" in seen_request[0].lower()
    assert len(t.segments) == 2
    first, second = t.segments
    assert first.summary == "SUMMARY: read big.txt, nothing left."
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "tool", "user", "assistant"]
    # the fresh context: system + task + summary, and the policy was called with exactly that
    assert [m["role"] for m in second.messages[:3]] == ["system", "user", "user"]
    assert second.messages[1]["content"] == "Read big.txt."
    assert second.messages[2]["content"] == SUMMARY_PREFIX + first.summary
    assert policy.seen[2] == second.messages[:3]
    assert [k.kind for k in t.turns] == ["action", "summary", "final"]
    assert [k.segment for k in t.turns] == [0, 0, 1]


async def test_trajectory_is_saved_after_every_step_even_when_the_policy_fails(ws, tmp_path):
    path = tmp_path / "traj" / "t.json"
    on_disk = []

    def second_turn(messages):
        on_disk.append(Trajectory.load(path))  # written after step one, before step two
        raise ConnectionError("endpoint down")

    policy = ScriptedPolicy([reply(call("read_file", path="a.py")), second_turn])
    with pytest.raises(ConnectionError):
        await Agent(policy, ws, save_path=path).run("go")
    assert on_disk[0].counts.turns == 1 and on_disk[0].stop_reason is None
    assert [m["role"] for m in on_disk[0].messages] == ["system", "user", "assistant", "tool"]
    final = Trajectory.load(path)
    assert final.stop_reason == "error" and "endpoint down" in final.error
    assert final.counts.turns == 1


async def test_cost_uses_reported_usage_and_prices(ws):
    policy = ScriptedPolicy([ChatReply(reply(call("read_file", path="a.py")), prompt_tokens=1000, completion_tokens=50),
                             ChatReply(FINAL, prompt_tokens=1200, completion_tokens=10)],
                            prices=Prices(input_per_mtok=2.0, output_per_mtok=10.0))
    t = await Agent(policy, ws).run("go")
    assert t.counts.prompt_tokens == 2200 and t.counts.completion_tokens == 60
    assert t.cost_usd == pytest.approx((2200 * 2.0 + 60 * 10.0) / 1e6)


async def test_cut_off_reply_without_a_call_is_sent_back_as_a_user_turn(ws):
    policy = ScriptedPolicy([ChatReply({"role": "assistant", "content": "I think that"}, finish_reason="length"),
                             FINAL])
    t = await Agent(policy, ws).run("go")
    assert t.stop_reason == "final"
    assert [k.kind for k in t.turns] == ["cut_off", "final"]
    assert t.messages[3]["role"] == "user" and "cut off" in t.messages[3]["content"]


# ----------------------------------------------------------------------------- token level

TOOL_TURN = ('<|think|>Look first.<|/think|>Reading.<|tool_call|>{"name": "read_file", "arguments": '
             '{"path": "a.py"}}<|/tool_call|>')


async def test_token_level_keeps_generated_ids_verbatim_with_masks_and_arrays(ws, tok):
    policy = ScriptedTokenPolicy(tok, [TOOL_TURN, "<|tool_call|>{oops<|/tool_call|>", "Done, x is 1."], version=7)
    t = await Agent(policy, ws).run("What is x?")
    assert t.stop_reason == "final" and t.token_level and len(t.segments) == 1
    seg = t.segments[0]
    ids, mask = seg.token_ids, seg.loss_mask
    assert len(ids) == len(mask) == len(seg.logprobs) == len(seg.policy_versions) == len(seg.routed_experts)
    # every prompt the policy saw is a prefix of the record: append-only
    for prompt in policy.prompts:
        assert ids[:len(prompt)] == prompt
    # the sampled ids sit right after each prompt, verbatim, with mask 1 and their arrays
    sampled = []
    for k, prompt in enumerate(policy.prompts):
        end = len(policy.prompts[k + 1]) if k + 1 < len(policy.prompts) else len(ids)
        out = [i for i, m in zip(ids[len(prompt):end], mask[len(prompt):end]) if m]
        expect = text_to_ids(tok, [TOOL_TURN, "<|tool_call|>{oops<|/tool_call|>", "Done, x is 1."][k]) + [tok.special_id(END)]
        assert out == expect and ids[len(prompt):len(prompt) + len(out)] == out
        sampled += list(range(len(prompt), len(prompt) + len(out)))
    assert [i for i, m in enumerate(mask) if m] == sampled
    for i in range(len(ids)):
        if mask[i]:
            assert seg.logprobs[i] == policy.logprob(ids[i]) and seg.policy_versions[i] == 7
            assert (seg.routed_experts[i] == policy.experts([ids[i]])[0]).all()
        else:
            assert seg.logprobs[i] == 0.0 and seg.policy_versions[i] == -1 and (seg.routed_experts[i] == -1).all()
    # well-formed turns re-render to the same ids: the whole record is the chat template's encoding
    assert seg.messages[3]["content"].startswith("a.py")
    # the malformed call came back as a tool error and counted
    assert t.counts.malformed_calls == 1 and "Error: malformed tool call" in seg.messages[5]["content"]
    assert t.counts.thinking_tokens == len(tok.encode("Look first."))


async def test_token_level_record_equals_the_chat_template_encoding(ws, tok):
    policy = ScriptedTokenPolicy(tok, [TOOL_TURN, "x is 1."])
    t = await Agent(policy, ws).run("What is x?")
    seg = t.segments[0]
    assert encode_messages(tok, seg.messages, t.tools) == seg.token_ids
    # what the loop inserted (system, task, tool result, role tokens) is all mask 0
    tool_turn = encode_turn(tok, seg.messages[3])
    start = seg.token_ids.index(tok.special_id("<|tool|>"))
    assert seg.token_ids[start:start + len(tool_turn)] == tool_turn
    assert not any(seg.loss_mask[start:start + len(tool_turn)])


async def test_token_level_cut_off_turn_gets_an_unmasked_end_token(ws, tok):
    policy = ScriptedTokenPolicy(tok, ["word " * 50, "ok"])
    t = await Agent(policy, ws, AgentConfig(max_new_tokens=8)).run("go")
    seg = t.segments[0]
    p1 = len(policy.prompts[0])
    assert seg.loss_mask[p1:p1 + 8] == [1] * 8
    assert seg.token_ids[p1 + 8] == tok.special_id(END) and seg.loss_mask[p1 + 8] == 0
    assert [k.kind for k in t.turns] == ["cut_off", "final"]


async def test_token_level_summary_opens_a_fresh_masked_context(ws, tok):
    (ws.root / "big.txt").write_text("lorem ipsum dolor\n" * 80)
    policy = ScriptedTokenPolicy(tok, [TOOL_TURN.replace("a.py", "big.txt"), "SUMMARY: read it.", "Finished."])
    start = start_tokens(tok, ws, "go")
    t = await Agent(policy, ws, AgentConfig(summarize_at=start + 100)).run("go")
    assert len(t.segments) == 2 and t.segments[0].summary == "SUMMARY: read it."
    fresh = t.segments[1]
    head = encode_messages(tok, fresh.messages[:3], t.tools)
    assert fresh.token_ids[:len(head)] == head and not any(fresh.loss_mask[:len(head)])
    assert policy.prompts[2] == head + [tok.special_id("<|assistant|>")]
    # the summary turn is trained on (mask 1) in the first segment
    first = t.segments[0]
    summary_ids = text_to_ids(tok, "SUMMARY: read it.")
    n = len(first.token_ids)
    assert first.token_ids[n - len(summary_ids) - 1:n - 1] == summary_ids
    assert all(first.loss_mask[n - len(summary_ids) - 1:])


async def test_token_level_through_the_fake_engine_and_in_process_client(ws, tok):
    reply_ids = assistant_reply(tok, "Reading.", tool_calls=[{"name": "read_file", "arguments": {"path": "a.py"}}])
    engine = FakeEngine(replies=[reply_ids, assistant_reply(tok, "x is 1.")], max_len=100_000)
    t = await Agent(TokenClientPolicy(InProcessClient(engine, tok), tok), ws).run("What is x?")
    assert t.stop_reason == "final" and t.final_message == "x is 1."
    seg = t.segments[0]
    first = engine.requests[0]
    assert first.return_routed_experts and first.return_logprob
    assert set(first.sampling.stop_token_ids) == {tok.special_id(END), tok.special_id("<|endoftext|>")}
    p = len(first.input_ids)
    assert seg.token_ids[:p] == list(first.input_ids)
    assert seg.token_ids[p:p + len(reply_ids)] == reply_ids and seg.loss_mask[p:p + len(reply_ids)] == [1] * len(reply_ids)
    assert seg.logprobs[p:p + len(reply_ids)] == [-(1 + i % 5) / 10 for i in reply_ids]
    assert seg.routed_experts.shape == (len(seg.token_ids), 2, 2)
    assert (seg.routed_experts[p:p + len(reply_ids)] >= 0).all() and (seg.routed_experts[:p] == -1).all()
    assert "x = 1" in seg.messages[3]["content"]


async def test_chat_client_policy_passes_usage_through(ws):
    class Client:
        def __init__(self):
            self.sent = []

        async def chat(self, messages, tools, sampling):
            self.sent.append(messages)
            if len(self.sent) == 1:
                return ChatResult(reply(call("read_file", path="a.py")) | {"reasoning_content": "hm"}, Usage(100, 3),
                                  "tool_calls")
            return ChatResult({"role": "assistant", "content": "hi"}, Usage(123, 4), "stop")

    client = Client()
    t = await Agent(ChatClientPolicy(client, "api", Prices(1.0, 2.0), send_thinking=False), ws).run("go")
    assert t.counts.prompt_tokens == 223 and t.counts.completion_tokens == 7 and t.policy == "api"
    assert t.cost_usd == pytest.approx((223 * 1.0 + 7 * 2.0) / 1e6)
    assert t.messages[2]["reasoning_content"] == "hm" and "reasoning_content" not in client.sent[1][2]


# ----------------------------------------------------------------------------- serialisation

def _same(a: Trajectory, b: Trajectory):
    assert a.to_dict(experts=False) == b.to_dict(experts=False)
    for sa, sb in zip(a.segments, b.segments):
        assert (sa.routed_experts is None) == (sb.routed_experts is None)
        if sa.routed_experts is not None:
            assert sa.routed_experts.dtype == sb.routed_experts.dtype == np.int32
            assert np.array_equal(sa.routed_experts, sb.routed_experts)


async def test_trajectory_round_trips_through_json_jsonl_and_npz(ws, tok, tmp_path):
    (ws.root / "big.txt").write_text("lorem ipsum dolor\n" * 80)
    policy = ScriptedTokenPolicy(tok, [TOOL_TURN.replace("a.py", "big.txt"), "SUMMARY", "Finished."])
    t = await Agent(policy, ws, AgentConfig(summarize_at=start_tokens(tok, ws, "go") + 100), task_id="task-1",
                    meta={"pass": 0}).run("go")
    t.grade, t.reward, t.patch = {"resolved": True}, 1.0, "diff --git a/x b/x\n"
    _same(t, Trajectory.from_dict(json.loads(t.to_json())))
    t.save(tmp_path / "t.json")
    assert (tmp_path / "t.json.experts.npz").is_file()
    assert "routed_experts" not in (tmp_path / "t.json").read_text()
    _same(t, Trajectory.load(tmp_path / "t.json"))
    write_jsonl([t, t], tmp_path / "t.jsonl")
    back = read_jsonl(tmp_path / "t.jsonl")
    assert len(back) == 2
    _same(t, back[1])


def test_an_object_that_is_not_a_policy_is_refused_with_what_it_needs(ws):
    from opencomposer.errors import ConfigError

    with pytest.raises(ConfigError, match="async chat"):
        Agent(object(), ws)


async def test_file_names_that_are_not_utf8_do_not_end_the_rollout(tmp_path, tok):
    import os

    for name in (b"\xff", b"caf\xe9.py", b"\xed\xa0\x80"):
        with open(os.path.join(os.fsencode(tmp_path), name), "wb") as f:
            f.write(b"x\n")
    calls = [call("list_dir", id="c0"), call("glob", id="c1", pattern="*")]
    chat = await Agent(ScriptedPolicy([reply(*calls), FINAL]), FakeWorkspace(tmp_path)).run("look")
    tool_turn = '<|tool_call|>{"name": "list_dir", "arguments": {}}<|/tool_call|><|tool_call|>' \
                '{"name": "glob", "arguments": {"pattern": "*"}}<|/tool_call|>'
    tokens = await Agent(ScriptedTokenPolicy(tok, [tool_turn, "Done."]), FakeWorkspace(tmp_path)).run("look")
    for t in (chat, tokens):
        assert t.stop_reason == "final" and t.counts.tool_errors == 0
        outputs = [m["content"] for m in t.messages if m["role"] == "tool"]
        assert all("\\xff" in o and "caf\\xe9.py" in o and "\\xed\\xa0\\x80" in o for o in outputs), outputs
        json.dumps(t.messages).encode("utf-8")


def test_trajectory_with_lone_surrogates_saves_and_loads_exactly(tmp_path):
    """A chat policy's reply (or a non-UTF-8 file name in a patch) may hold lone surrogates."""
    t = Trajectory(id="s", final_message="caf\udce9 \ud800", patch="diff --git a/\udcff b/\udcff\n")
    t.save(tmp_path / "t.json")
    back = Trajectory.load(tmp_path / "t.json")
    assert (back.final_message, back.patch) == (t.final_message, t.patch)
    write_jsonl([t], tmp_path / "t.jsonl")
    assert read_jsonl(tmp_path / "t.jsonl")[0].final_message == t.final_message


def test_appending_after_a_line_cut_by_a_crash_drops_the_cut_line(tmp_path):
    """A crash mid-write leaves a cut last line (read_jsonl skips it); the resumed run's next
    append must not join it (the joined line would not parse and every later read would fail)."""
    a, b, c = (Trajectory(id=i, task_id=i, final_message=f"done {i}") for i in "abc")
    path = tmp_path / "t.jsonl"
    write_jsonl([a, b], path)
    text = path.read_text()
    path.write_text(text[: len(text) - 20])  # b's line cut
    assert [t.id for t in read_jsonl(path)] == ["a"]
    write_jsonl([c], path)
    assert [t.id for t in read_jsonl(path)] == ["a", "c"]
    path.write_text(a.to_json()[:10])  # only a cut line
    write_jsonl([c], path)
    assert [t.id for t in read_jsonl(path)] == ["c"]
