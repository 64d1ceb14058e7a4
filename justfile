# The few commands people run. `just --list` shows them.

# Run the test suite (what CI runs, after fmt and clippy).
test:
    cargo test --locked

# Formatting and lints, as CI checks them.
lint:
    cargo fmt --check
    cargo clippy --all-targets --locked -- -D warnings

# Format the code.
fmt:
    cargo fmt

# Validation benchmark (release build).
bench:
    cargo bench --bench validate

# Everything CI runs.
ci:
    bash .ci/run

# Refresh schemas/workflow.schema.json after changing the spec types.
schema:
    cargo run -q -- schema --generate > schemas/workflow.schema.json

# Validate the shipped workflows and run their *.test.yaml cases.
workflows:
    cargo run -q -- validate workflows/
    cargo run -q -- test workflows/
