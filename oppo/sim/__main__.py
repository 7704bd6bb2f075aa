import gc

# Importing the command's modules makes tens of thousands of objects that live as long as the process: with the
# collector off while they are made, then frozen (never scanned again), it does not walk them at every command's
# start (~0.03 s CPU; the few hundred cyclic ones the imports leave stay, frozen).
enabled = gc.isenabled()
gc.disable()
try:
    from oppo.sim.cli import entry
finally:
    gc.freeze()
    if enabled:
        gc.enable()
entry()
