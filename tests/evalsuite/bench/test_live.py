"""The progress bars' running accuracy: the extraction rules the task YAMLs use."""

from __future__ import annotations

from evalsuite.bench.live import ChoiceTally, Tally, gold_of, judge_generation

GSM = {"question": "q", "answer": "She pays 3 * 6 = 18 dollars.\n#### 1,800"}
GPQA = {"Question": "q", "answer": "(C)", "answer_letter": "C", **{f"choice{i}": "x" for i in range(1, 5)}}


def test_gold_of():
    assert gold_of(GSM) == ("number", "1800")
    assert gold_of(GPQA) == ("letter", "C")
    assert gold_of({"question": "no gold here"}) is None
    assert gold_of(None) is None


def test_judge_generation_gsm8k_takes_the_last_number():
    assert judge_generation(GSM, " 3 * 600 = 1,800. The answer is 1800.")
    assert not judge_generation(GSM, " 1800 minus 2 is 1798")
    assert not judge_generation(GSM, " no number")


def test_judge_generation_gpqa_letter_is_the_last_parenthesised_one():
    assert judge_generation(GPQA, "Thinking... The answer is (C).")
    assert judge_generation(GPQA, "(A) is wrong, (B) too; so the answer is (c)")
    assert not judge_generation(GPQA, "The answer is (C)? No: (B)")  # flexible-extract takes the last
    assert not judge_generation(GPQA, "so the answer is c")  # no parentheses: flexible-extract finds nothing
    assert not judge_generation(GPQA, "I cannot tell")
    assert judge_generation({"x": 1}, "anything") is None


def test_tally_postfix():
    t = Tally()
    assert t.postfix() == {}
    for ok in (True, False, None, True):
        t.add(ok)
    assert t.postfix() == {"acc": "0.667 (2/3)"}


def test_choice_tally_counts_a_doc_once_all_choices_are_in():
    t = ChoiceTally()
    for idx, ll in enumerate([-3.0, -2.5, -1.0]):
        t.add_choice(GPQA, 0, idx, 4, ll)
    assert t.seen == 0  # one choice still missing
    t.add_choice(GPQA, 0, 3, 4, -9.0)
    assert (t.right, t.seen) == (1, 1)  # (C) has the highest loglikelihood
    for idx, ll in enumerate([-1.0, -2.5, -3.0, -4.0]):
        t.add_choice(GPQA, 1, idx, 4, ll)
    assert (t.right, t.seen) == (1, 2)
