"""Rollout engines: what generates the actor's tokens (:mod:`.hf`: a decode loop over Hugging Face forward passes with a
preallocated KV cache).
"""
