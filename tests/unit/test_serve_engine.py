"""The model side of `mini-gpt serve` (mini_gpt/serve/engine.py), without HTTP: the same tokens as the
sampler `mini-gpt generate` runs, the probabilities the model gave them, stop strings, cancellation, the
queue, whole UTF-8 characters, and the attention view's weights."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import REPO, bpe_model

from mini_gpt.errors import MiniGPTError
from mini_gpt.infer.sampling import generate
from mini_gpt.model.gpt import GPT, GPTConfig
from mini_gpt.serve.engine import CANCELLED, Engine, Job, Step, prompt_groups, token_text
from mini_gpt.tokenizer import CharTokenizer, build_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # tiny Shakespeare's 65


def char_model(seed: int = 0, block_size: int = 32) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=len(CHARS), block_size=block_size)).eval()


@pytest.fixture(scope="module")
def engine():
    eng = Engine(char_model(), CharTokenizer(CHARS), torch.device("cpu"))
    yield eng
    eng.close()


def run(engine: Engine, **kw) -> tuple[Job, list[Step]]:
    """Submit a job and wait for it; returns the job and its steps."""
    steps: list[Step] = []
    finished = threading.Event()
    errors: list[BaseException | None] = []
    job = Job(emit=steps.append, done=lambda e: (errors.append(e), finished.set()), **kw)
    engine.submit(job)
    assert finished.wait(30)
    assert errors == [None]
    return job, steps


def test_tokens_are_the_samplers_for_the_same_seed(engine) -> None:
    ids = engine.encode("ROMEO:")
    job, steps = run(engine, ids=ids, max_tokens=40, temperature=0.9, top_k=20, top_p=0.95, seed=7, n=2)
    reference = generate(
        char_model(), torch.tensor([ids]), 40, temperature=0.9, top_k=20, top_p=0.95,
        generator=torch.Generator().manual_seed(7), num_samples=2,
    )  # fmt: skip
    for row in range(2):
        tokens = [s.token for s in steps if s.row == row and s.token >= 0]
        assert tokens == reference[row, len(ids) :].tolist()
        assert "".join(s.text for s in steps if s.row == row) == job.streams[row].text
        assert job.streams[row].text == CharTokenizer(CHARS).decode(tokens)
    assert job.finish == ["length", "length"]


def test_logprobs_are_the_models_own(engine) -> None:
    ids = engine.encode("To be")
    _, steps = run(engine, ids=ids, max_tokens=5, temperature=0.0, top_logprobs=5)
    model = char_model()
    seq = list(ids)
    for step in steps:
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([seq]))[0][0, -1].double(), dim=-1)
        assert step.token == int(logprobs.argmax())  # greedy: the top alternative is the chosen token
        assert step.logprob == pytest.approx(float(logprobs[step.token]), abs=1e-4)
        assert [i for i, _ in step.top] == logprobs.topk(5).indices.tolist()
        assert [lp for _, lp in step.top] == pytest.approx(logprobs.topk(5).values.tolist(), abs=1e-4)
        seq.append(step.token)


def test_a_stop_string_ends_the_sample_without_it(engine) -> None:
    ids = engine.encode("a")
    free, _ = run(engine, ids=ids, max_tokens=30, temperature=1.0, seed=3)
    text = free.streams[0].text
    stop = text[10:12]
    job, steps = run(engine, ids=ids, max_tokens=30, temperature=1.0, seed=3, stops=[stop])
    assert job.streams[0].text == text[: text.index(stop)]
    assert "".join(s.text for s in steps) == job.streams[0].text
    assert job.finish == ["stop"]


def test_cancel_stops_at_the_next_token(engine) -> None:
    steps: list[Step] = []
    finished = threading.Event()
    job = Job(ids=engine.encode("a"), max_tokens=5000, temperature=1.0, seed=1, done=lambda e: finished.set())

    def emit(step: Step) -> None:
        steps.append(step)
        if len(steps) == 3:
            job.cancel.set()

    job.emit = emit
    engine.submit(job)
    assert finished.wait(30)
    assert len(steps) == 3 and job.streams[0].tokens == 3
    assert engine.waiting == 0


def test_jobs_run_one_at_a_time_in_order(engine) -> None:
    order: list[int] = []
    running = []
    done = [threading.Event() for _ in range(4)]

    def emitter(k: int):
        def emit(step: Step) -> None:
            running.append(k)
            order.append(k)

        return emit

    for k in range(4):
        job = Job(ids=engine.encode("a"), max_tokens=6, temperature=1.0, seed=k, emit=emitter(k),
                  done=lambda e, k=k: done[k].set())  # fmt: skip
        engine.submit(job)
    assert all(d.wait(30) for d in done)
    assert order == [k for k in range(4) for _ in range(6)]  # never interleaved


def test_bad_settings_are_refused_before_queueing(engine) -> None:
    with pytest.raises(MiniGPTError, match="top_p"):
        engine.submit(Job(ids=[1], max_tokens=3, top_p=1.5))
    with pytest.raises(MiniGPTError, match=r"token ids must be 0\.\.64"):
        engine.encode([1, 99])
    with pytest.raises(MiniGPTError, match="not in the character vocabulary: '€'"):
        engine.encode("€")
    assert engine.waiting == 0


def test_attention_is_the_exact_paths_row(engine) -> None:
    ids = engine.encode("ROMEO: what")
    view = engine.attention(ids, 6)
    with torch.no_grad():
        attentions = char_model().attention_weights(torch.tensor([ids[:7]]))
    assert view["start"] == 0 and view["position"] == 6
    assert len(view["weights"]) == 2 and len(view["weights"][0]) == 2 and len(view["weights"][0][0]) == 7
    for layer, att in enumerate(attentions):
        assert torch.tensor(view["weights"][layer]) == pytest.approx(att[0, :, -1, :], abs=1e-5)
        assert torch.tensor(view["weights"][layer]).sum(-1) == pytest.approx(torch.ones(2), abs=1e-5)
    with pytest.raises(MiniGPTError, match="outside"):
        engine.attention(ids, len(ids))


def test_attention_past_block_size_sees_the_last_block(engine) -> None:
    ids = engine.encode("abcdefghij" * 5)  # 50 tokens, block_size 32
    view = engine.attention(ids, 45)
    assert view["start"] == 14 and len(view["weights"][0][0]) == 32


def test_bpe_text_never_shows_half_a_character() -> None:
    tokenizer = build_tokenizer("gpt2", bpe_file=REPO / "data" / "tokenizers" / "gpt2.tiktoken")
    text = "a 🙂 b 日本"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.split()) + 2  # the emoji and the CJK characters span several tokens
    groups = prompt_groups(tokenizer, ids)
    assert "".join(g["text"] for g in groups) == text
    assert all("\ufffd" not in g["text"] for g in groups)
    assert [i for g in groups for i in g["ids"]] == ids
    assert any(len(g["ids"]) > 1 for g in groups)
    assert token_text(tokenizer, tokenizer.encode("🙂")[0]).startswith("\\x")  # a partial token's bytes

    eng = Engine(bpe_model(block_size=32), tokenizer, torch.device("cpu"))
    try:
        job, steps = run(eng, ids=tokenizer.encode("日本"), max_tokens=24, temperature=1.0, seed=5)
    finally:
        eng.close()
    assert "".join(s.text for s in steps) == job.streams[0].text
    tokens = [s.token for s in steps if s.token >= 0]
    assert len(tokens) == 24


def test_cancel_all_ends_running_and_queued_jobs(engine) -> None:
    started, done = threading.Event(), [threading.Event(), threading.Event()]
    running = Job(ids=engine.encode("a"), max_tokens=5000, temperature=1.0, seed=1,
                  emit=lambda step: started.set(), done=lambda e: done[0].set())  # fmt: skip
    queued = Job(ids=engine.encode("a"), max_tokens=5000, done=lambda e: done[1].set())
    engine.submit(running)
    engine.submit(queued)
    assert started.wait(30)
    engine.cancel_all()
    assert done[0].wait(30) and done[1].wait(30)
    # cut short: neither "length" (5000 tokens were not reached) nor "stop" (no stop string was met)
    assert running.streams[0].tokens < 5000 and running.finish == [CANCELLED]
    assert queued.streams == [] and queued.finish == [CANCELLED]  # never ran
    assert engine.waiting == 0


def test_after_cancel_all_new_jobs_are_cancelled_and_finished_ones_keep_their_reason() -> None:
    eng = Engine(char_model(), CharTokenizer(CHARS), torch.device("cpu"))
    try:
        whole, _ = run(eng, ids=eng.encode("a"), max_tokens=5, seed=1)
        assert whole.finish == ["length"]
        eng.cancel_all()  # Ctrl-C: a request that arrives while the server stops never runs
        late, steps = run(eng, ids=eng.encode("a"), max_tokens=5, seed=1)
        assert late.finish == [CANCELLED] and steps == []
    finally:
        eng.close()
