"""The peers' trainers set up as oppo trains, for side-by-side runs: TRL 1.12's PPOTrainer (:mod:`.trl_ppo`) and
GRPOTrainer (:mod:`.trl_grpo`).
"""


def trl_without_vllm() -> None:
    """Tell TRL that vLLM is absent, before its trainers load. TRL 1.12 imports vLLM's weight-transfer classes wherever
    a vLLM is installed and supports vLLM 0.19-0.27; the 0.32 build the rollout engine uses lacks them, and importing
    GRPOTrainer then fails. The baselines generate with Hugging Face ``generate`` (TRL's vLLM path needs CUDA), so
    nothing they run changes."""
    import importlib

    importlib.import_module("trl.import_utils").is_vllm_available = lambda min_version=None: False
