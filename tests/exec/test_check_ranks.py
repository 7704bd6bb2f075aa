"""``--check-ranks`` under ``--shard``: two sharded ranks (two gloo processes started by the test) agree after a
common update; a shard changed on one rank, or an update one rank takes with another learning rate, makes their
digests differ. The actor is a tied Qwen2: its head stays its input embedding under sharding."""

import json
import math
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen2ForCausalLM

from oppo.exec.compute.timing import Recorder
from oppo.exec.compute.update import apply_gradients
from oppo.exec.config import ExecConfig, default_schedule
from oppo.exec.models.random_checkpoints import qwen2_config
from oppo.exec.models.roles import Roles
from oppo.exec.step.rank import ActorRank, join_group

TINY_QWEN2 = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=64,
)


def _update(rank: ActorRank, index: int) -> None:
    """A minibatch step on this rank's rows (its own), gradients summed over the ranks."""
    actor = rank.roles.actor
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(index))
    actor(input_ids=ids).logits.square().mean().backward()
    apply_gradients(rank.learner.actor_opt, actor, max_norm=1.0)


def _rank(index: int, port: int, out: str) -> None:
    """One of the two ranks: digests after a common update, after rank 1 changed one element of its shard (and
    put it back), and after an update rank 1 took with another learning rate."""
    torch.set_num_threads(1)
    join_group("gloo", "127.0.0.1", port, index, 2)
    torch.manual_seed(0)
    actor = Qwen2ForCausalLM(qwen2_config(TINY_QWEN2, tied=True)).double().requires_grad_(True)
    cpu = torch.device("cpu")
    roles = Roles(actor, None, None, None, pad_id=0, eos_id=0, vocab_size=64, device=cpu, dtype=torch.float64)
    schedule = default_schedule(algo="grpo", group_size=2, batch=4)
    config = ExecConfig(schedule=schedule, dp=2, shard=True, check_ranks=True)
    rank = ActorRank.joined(config, roles, Recorder(), f"cpu{index}", ())
    digests = {}
    _update(rank, index)
    digests["updated"] = rank.digest()
    shard = actor.model.layers[0].mlp.up_proj.weight.to_local().view(-1)
    kept = shard[0].clone()
    if index == 1:
        with torch.no_grad():
            shard[0] = torch.nextafter(kept, torch.tensor(math.inf, dtype=kept.dtype))
    digests["shard changed"] = rank.digest()
    with torch.no_grad():
        shard[0] = kept
    digests["put back"] = rank.digest()
    if index == 1:
        rank.learner.actor_opt.param_groups[0]["lr"] *= 2
    _update(rank, index)
    digests["another lr"] = rank.digest()
    tied = actor.lm_head.weight is actor.get_input_embeddings().weight
    with open(f"{out}/{index}.json", "w") as f:
        json.dump({"digests": digests, "tied": tied}, f)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_check_ranks_sees_a_sharded_rank_drift(tmp_path):
    context = mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 240  # the ranks meet in collectives: a regression may leave one waiting
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "the two ranks did not finish"
    finally:
        for process in context.processes:  # the two processes this test started
            if process.is_alive():
                process.kill()
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    same = {name: results[0]["digests"][name] == results[1]["digests"][name] for name in results[0]["digests"]}
    assert same == {"updated": True, "shard changed": False, "put back": True, "another lr": False}
    assert all(r["tied"] for r in results), "the head should be the input embedding, sharded"
