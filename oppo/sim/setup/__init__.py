"""What a simulation runs on: the presets (:mod:`.presets`) and setup TOML files (:mod:`.toml_file`)."""
