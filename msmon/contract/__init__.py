"""The contract between job and bot: wire Structs, the codec, the job-action vocabulary. Needs msgspec only."""
