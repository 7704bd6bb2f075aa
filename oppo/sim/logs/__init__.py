"""Real training logs: reading them, verl's configuration, the setup a log describes, the device read back, the fit of
the framework layer, its report, the shared layer over several logs, the trust note, and their commands.
"""
