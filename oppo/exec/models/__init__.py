"""The four roles' networks: loading checkpoint folders (:mod:`.roles`), the tiny presets' checkpoints (:mod:`.tiny`),
SmolLM2 (:mod:`.pretrained`) and real architectures with random weights (:mod:`.random_checkpoints`).
"""
