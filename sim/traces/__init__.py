"""What the simulator replays: the Azure 2023 traces, Mooncake JSONL, seeded synthetic chat.
"""
