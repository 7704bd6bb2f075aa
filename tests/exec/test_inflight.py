"""In-flight weight updates: a generation switched to new weights mid-sequence samples its later tokens from the
new policy, with behaviour log-probs of the weights that sampled each token."""

import copy

import pytest
import torch

from oppo.exec.compute.rollout import Rollout
from oppo.exec.compute.scoring import score_once
from oppo.exec.compute.timing import Recorder
from oppo.exec.config import ExecConfig, default_schedule

EOS, PAD = 1, 0


def _perturbed(actor: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Weights a visible step away from ``actor``'s (an update's worth, so the policies differ)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in actor.state_dict().items()}


def _rows():
    g = torch.Generator().manual_seed(1)
    prompts = {i: torch.randint(3, 64, (n,), generator=g).tolist() for i, n in ((7, 5), (8, 8), (9, 3))}
    # (seq id, budget, sampling key, forced length, response tokens so far): lengths forced so that no row stops
    # before the switch, and one (9) stops right after it
    decoding = [(7, 20, 101, 20, 0), (8, 16, 202, 16, 0), (9, 7, 303, 7, 0)]
    return prompts, decoding


@pytest.mark.parametrize("switch_at", [3, 6])
def test_tokens_after_a_switch_are_the_new_weights_samples(tiny_models, switch_at):
    actor = copy.deepcopy(tiny_models[torch.float64][0])
    old, new = copy.deepcopy(actor.state_dict()), _perturbed(actor, 5)
    prompts, decoding = _rows()
    rollout = Rollout(actor, EOS, PAD, 1.0, Recorder(), "cpu1")
    rollout.begin(0, prompts, decoding)
    tokens, behaviour = {i: [] for i in prompts}, {i: [] for i in prompts}

    def decode(n):
        _, chunk, logps = rollout.decode(0, n)
        for i in chunk:
            tokens[i] += chunk[i]
            behaviour[i] += logps[i]

    decode(switch_at)
    actor.load_state_dict(new)
    rollout.refill(0)
    decode(100)
    assert {i: len(t) for i, t in tokens.items()} == {7: 20, 8: 16, 9: 7}
    seqs = [(i, prompts[i] + tokens[i], len(prompts[i])) for i in prompts]
    under_new = dict(zip(prompts, score_once(actor, "logprob", seqs, PAD, 1.0)))
    actor.load_state_dict(old)
    under_old = dict(zip(prompts, score_once(actor, "logprob", seqs, PAD, 1.0)))
    for i in prompts:
        got = torch.tensor(behaviour[i], dtype=torch.float64)
        # float64 throughout; sampling and scoring batch and pad differently: rounding only (1e-9 absolute)
        torch.testing.assert_close(got[:switch_at], under_old[i][:switch_at], rtol=0, atol=1e-9)
        torch.testing.assert_close(got[switch_at:], under_new[i][switch_at:], rtol=0, atol=1e-9)
        # and the switch mattered: the new policy's log-probs of the early tokens are not the old ones
        assert float((under_new[i][:switch_at] - under_old[i][:switch_at]).abs().max()) > 1e-3


def test_a_switch_without_new_weights_changes_nothing(tiny_models):
    """A re-prefill under the same weights continues with the very tokens and log-probs an unbroken decode gives:
    sampling is keyed by response position, not by where a chunk or a prefill fell."""
    actor = copy.deepcopy(tiny_models[torch.float64][0])
    prompts, decoding = _rows()
    runs = []
    for refill in (False, True):
        rollout = Rollout(actor, EOS, PAD, 1.0, Recorder(), "cpu1")
        rollout.begin(0, prompts, decoding)
        _, first, lp1 = rollout.decode(0, 4)
        if refill:
            rollout.refill(0)
        _, rest, lp2 = rollout.decode(0, 100)
        tokens = {i: first.get(i, []) + rest.get(i, []) for i in prompts}
        runs.append((tokens, {i: lp1[i] + lp2.get(i, []) for i in lp1}))
    assert runs[0][0] == runs[1][0]
    for i in prompts:
        assert runs[0][1][i] == pytest.approx(runs[1][1][i], abs=1e-9)


def test_inflight_updates_needs_rollout_workers_and_staleness():
    with pytest.raises(ValueError, match="--rollout-workers"):
        ExecConfig(schedule=default_schedule(policy="async", staleness=1), inflight_updates=True)
    with pytest.raises(ValueError, match="--staleness 0"):
        ExecConfig(schedule=default_schedule(policy="async", staleness=0), rollout_workers=1, inflight_updates=True)
