"""The lm-eval adapter through lm-eval's own simple_evaluate, offline, on a task YAML written here."""

from __future__ import annotations

import json

import pytest

ITEMS = [  # written for this test: tiny arithmetic a byte-level random model can still be scored on
    {"question": "2 + 2 =", "answer": "4"},
    {"question": "3 + 5 =", "answer": "8"},
    {"question": "1 + 6 =", "answer": "7"},
]


@pytest.fixture()
def task_dir(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(x) + "\n" for x in ITEMS))
    (tmp_path / "tiny_gen.yaml").write_text(f"""
task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
""")
    (tmp_path / "tiny_ll.yaml").write_text(f"""
task: tiny_ll
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: ["4", "7", "8"]
doc_to_target: "{{{{['4', '7', '8'].index(answer)}}}}"
metric_list:
  - metric: acc
""")
    return tmp_path


@pytest.mark.parametrize("engine", ["reference", "megakernel"])
def test_simple_evaluate_offline(task_dir, engine, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from evalsuite.bench.adapter import EngineLM

    lm = EngineLM(engine=engine, model="mini-llama")
    res = lm_eval.simple_evaluate(model=lm, tasks=["tiny_gen", "tiny_ll"],
                                  task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
                                  log_samples=True)
    import numpy as np

    from engines.reference import ReferenceEngine
    from evalsuite.stops import visible_text

    # lm-eval's scores equal what an independent computation on the engine-free reference gives:
    # greedy text cut at the stop string for tiny_gen, full-forward choice scores for tiny_ll
    ref = ReferenceEngine(lm.model.weights)
    tok = lm.model.tokenizer
    samples = sorted(res["samples"]["tiny_gen"], key=lambda s: s["doc_id"])
    gens = [s["resps"][0][0] for s in samples]
    want = [visible_text(tok, g.token_ids).split("\n")[0] for g in ref.generate(
        [tok.encode(x["question"]) for x in ITEMS], 6, stop_ids=tok.eos_ids, top_k=1)]
    assert gens == want
    assert res["results"]["tiny_gen"]["exact_match,none"] == pytest.approx(
        np.mean([g == x["answer"] for g, x in zip(gens, ITEMS)]))
    right = 0
    for x in ITEMS:
        ctx = tok.encode(x["question"])
        scores = []
        for ch in ("4", "7", "8"):
            cont = tok.encode(x["question"] + " " + ch)[len(ctx):]
            lp = _log_softmax(ref.score([ctx + cont])[0].logits)
            scores.append(sum(lp[len(ctx) - 1 + j, t] for j, t in enumerate(cont)))
        right += int(np.argmax(scores)) == ["4", "7", "8"].index(x["answer"])
    assert res["results"]["tiny_ll"]["acc,none"] == pytest.approx(right / len(ITEMS))


def _log_softmax(logits):
    import numpy as np

    z = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_adapters_agree_on_loglikelihood():
    """Both adapters' loglikelihood (decode path) equals the sum of the continuation's log-softmax
    from an independent full forward (score) of context + continuation. Two adapters agreeing
    is not enough: session 1's adapter scored the wrong (shifted by one) tokens in both engines."""
    import numpy as np

    from evalsuite.bench.adapter import EngineLM

    ref_lm = EngineLM(engine="reference", model="mini-llama")
    mk_lm = EngineLM(engine="megakernel", model="mini-llama")
    # the last case has a one-token context: the adapter's score-path branch (len(seq) - n < 2)
    for ctx, cont in [([5, 9, 30, 44], [71, 12]), ([5, 9, 30, 44, 8, 3], [71, 12, 99, 4]), ([7, 7], [33]),
                      ([7], [33, 5])]:
        reqs = [(("ctx", "c"), ctx, cont)]
        a = ref_lm._loglikelihood_tokens(reqs)[0]
        b = mk_lm._loglikelihood_tokens(reqs)[0]
        logits = ref_lm.engine.score([ctx + cont])[0].logits.astype(np.float64)
        z = logits - logits.max(-1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        rows = np.arange(len(ctx) - 1, len(ctx) + len(cont) - 1)  # row t predicts token t + 1
        want = float(lp[rows, cont].sum())
        greedy = bool((lp[rows].argmax(-1) == np.asarray(cont)).all())
        assert abs(a[0] - want) < 1e-4 and a[1] == greedy, (a, want)
        assert abs(b[0] - want) < 1e-4 and b[1] == greedy


def test_sampling_is_refused():
    from lm_eval.api.instance import Instance

    from evalsuite.bench.adapter import EngineLM
    from evalsuite.errors import SpecError

    lm = EngineLM(engine="reference", model="mini-llama")
    req = Instance("generate_until", {}, ("2 + 2 =", {"do_sample": True, "temperature": 0.7}), 0)
    with pytest.raises(SpecError, match="greedily"):
        lm.generate_until([req])
