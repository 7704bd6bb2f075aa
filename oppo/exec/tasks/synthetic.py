"""The default task: synthetic prompts, a rule score, and the preparation of the tiny presets' checkpoints.

Tokens ``>= 3`` are content; a response scores by the fraction of its content tokens that are *target* tokens
(``id % 4 == 3``), so a random policy starts near 0.25 and PPO can push it towards 1. The learned reward model
is a transformer trained on synthetic preference pairs ranked by that rule (Bradley-Terry loss); the actor is
first warmed up (SFT) on responses with long-tailed lognormal lengths, so its natural lengths are long-tailed.
"""

from __future__ import annotations

import torch

PAD, EOS, BOS = 0, 1, 2  # special token ids of the task's vocabulary
FIRST_CONTENT = 3  # ids from here on are content tokens


def is_target(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens >= FIRST_CONTENT) & (tokens % 4 == 3)


def rule_score(responses: list[list[int]]) -> torch.Tensor:
    """Fraction of target tokens among each response's content tokens (0 for an empty response). Shape (N,)."""
    scores = []
    for tokens in responses:
        content = torch.tensor([t for t in tokens if t >= FIRST_CONTENT], dtype=torch.long)
        scores.append(is_target(content).float().mean().item() if len(content) else 0.0)
    return torch.tensor(scores)


def random_prompts(generator: torch.Generator, n: int, length: int, vocab_size: int) -> list[list[int]]:
    return torch.randint(FIRST_CONTENT, vocab_size, (n, length), generator=generator).tolist()


def _lognormal_lengths(generator: torch.Generator, n: int, median: float, sigma: float, cap: int) -> torch.Tensor:
    z = torch.randn(n, generator=generator)
    return (median * torch.exp(sigma * z)).round().clamp(1, cap).long()


def _responses(generator, n: int, vocab_size: int, target_frac: torch.Tensor, lengths: torch.Tensor):
    """Random content responses where each token is a target token with probability ``target_frac[i]``."""
    out = []
    targets = torch.arange(FIRST_CONTENT, vocab_size)
    targets, others = targets[is_target(targets)], targets[~is_target(targets)]
    for i in range(n):
        k = int(lengths[i])
        pick_target = torch.rand(k, generator=generator) < target_frac[i]
        t = targets[torch.randint(len(targets), (k,), generator=generator)]
        o = others[torch.randint(len(others), (k,), generator=generator)]
        out.append(torch.where(pick_target, t, o).tolist())
    return out


def _batch(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and attention mask. Shapes (N, T)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def sft_warmup(actor, vocab_size: int, steps: int = 300, batch: int = 32, prompt_len: int = 8, seed: int = 0):
    """Teach the actor to answer with long-tailed lengths (median 10 tokens, p99/p50 about 5) and end with EOS."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(actor.parameters(), lr=3e-3)
    actor.train()
    for _ in range(steps):
        prompts = random_prompts(g, batch, prompt_len, vocab_size)
        lengths = _lognormal_lengths(g, batch, median=10, sigma=0.7, cap=44)
        responses = _responses(g, batch, vocab_size, torch.full((batch,), 0.25), lengths)
        ids, mask = _batch([p + r + [EOS] for p, r in zip(prompts, responses)])
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :prompt_len] = -100  # learn the response only
        loss = actor(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    actor.eval()


def train_reward_model(reward, vocab_size: int, steps: int = 400, batch: int = 32, prompt_len: int = 8, seed: int = 1):
    """Bradley-Terry training on pairs ranked by :func:`rule_score` (ties skipped)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(reward.parameters(), lr=2e-3)
    reward.train()
    for _ in range(steps):
        pairs = []
        for _side in range(2):
            prompts = random_prompts(g, batch, prompt_len, vocab_size)
            lengths = _lognormal_lengths(g, batch, median=10, sigma=0.8, cap=48)
            responses = _responses(g, batch, vocab_size, torch.rand(batch, generator=g), lengths)
            finished = torch.rand(batch, generator=g) < 0.9
            seqs = [p + r + ([EOS] if f else []) for p, r, f in zip(prompts, responses, finished)]
            pairs.append((seqs, rule_score(responses)))
        (a, score_a), (b, score_b) = pairs
        ids, mask = _batch(a + b)
        out = reward(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
        margin = (out[:batch] - out[batch:]) * torch.sign(score_a - score_b)
        keep = score_a != score_b
        loss = -torch.nn.functional.logsigmoid(margin[keep]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    reward.eval()
