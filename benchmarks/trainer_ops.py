"""Two costs on the asynchronous trainer's path, each against what it replaced, on one core: the optimizer step
(Adam as a loop over parameters, torch's CPU default, against the fused kernel) and publishing the actor's weights
to a rollout worker (a pickled clone of the tensors against numpy arrays read in place).

    python benchmarks/trainer_ops.py --preset small-cpu --repeats 5

Variants are interleaved within each repeat; prints the median seconds, the range over repeats and the ratio.
"""

import argparse
import statistics
import time

import ray
import torch

from oppo.exec.config import ModelConfig
from oppo.exec.distributed.rollout_worker import shareable, unshared
from oppo.exec.models.roles import load_role, resolve_device


@ray.remote(num_cpus=1)
class Loader:
    """A rollout worker's side of publishing: the actor's weights loaded from what the trainer put."""

    def __init__(self, preset: str) -> None:
        torch.set_num_threads(1)
        self.actor = load_role(ModelConfig(preset=preset), "actor", resolve_device("cpu"))

    def load(self, state: dict, numpy: bool) -> None:
        self.actor.load_state_dict(unshared(state) if numpy else state)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small-cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    actor = load_role(ModelConfig(preset=args.preset), "actor", resolve_device("cpu"))
    ids = torch.randint(3, actor.config.vocab_size, (1, 136))  # one row: a prompt and a 128-token response
    actor(input_ids=ids).logits.float().logsumexp(-1).mean().backward()  # gradients for the optimizer to apply
    optimizers = {"Adam, loop": torch.optim.Adam(actor.parameters(), lr=1e-9)}
    optimizers["Adam, fused"] = torch.optim.Adam(actor.parameters(), lr=1e-9, fused=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    loader = Loader.remote(args.preset)

    def publish(numpy: bool) -> None:
        state = {k: v.detach() for k, v in actor.state_dict().items()}
        ref = ray.put(shareable(state) if numpy else {k: v.clone() for k, v in state.items()})
        ray.get(loader.load.remote(ref, numpy))

    variants = {name: (lambda o=o: o.step()) for name, o in optimizers.items()}
    variants |= {"publish, pickled clone": lambda: publish(False), "publish, numpy": lambda: publish(True)}
    for fn in variants.values():
        fn()  # warm-up: optimizer states, the worker's first load
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn))
    ray.shutdown()
    print(f"{args.preset}, one core, {args.repeats} interleaved repeats: median seconds [range]")
    for name, values in times.items():
        print(f"  {name:<24} {statistics.median(values):.4f} [{min(values):.4f}, {max(values):.4f}]")
    for old, new in (("Adam, loop", "Adam, fused"), ("publish, pickled clone", "publish, numpy")):
        print(f"  {new} over {old}: {statistics.median(times[old]) / statistics.median(times[new]):.2f}x faster")


if __name__ == "__main__":
    main()
