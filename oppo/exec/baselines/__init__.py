"""The peers' trainers set up as oppo trains, for side-by-side runs: TRL 1.12's PPOTrainer (:mod:`.trl_ppo`) and
GRPOTrainer (:mod:`.trl_grpo`).
"""
