"""The built-in prompt suite and the text that sizes long prompts.

Every prompt starts with a fresh nonce, so the server's prefix cache can never serve a "cold"
prefill from an earlier request (a cache hit would make TTFT and prefill tok/s look far better than
the model is). Long contexts are built from varied English sentences, not random tokens, so
speculative decoders see text they can predict, as in real use.
"""

from __future__ import annotations

import random
import secrets

CATEGORIES: dict[str, str] = {
    "coding": "Write a Python function that merges overlapping intervals in a list of (start, end) pairs. "
    "Include type hints, a docstring and three doctest examples, then explain its complexity.",
    "prose": "Write a short essay on why lighthouses were built where they were, and what replaced their "
    "keepers. Use clear paragraphs and a calm, curious tone.",
    "reasoning": "A train leaves at 9:40 and travels 210 km at 84 km/h, then waits 12 minutes, then covers "
    "96 km at 72 km/h. When does it arrive? Reason step by step and check the result.",
    "summary": "Summarise the following in five bullet points: The town council met to discuss the new "
    "bridge. Engineers reported the old one has cracks in two piers. Residents asked about noise, cost "
    "and a detour for the school bus. The council voted to fund a study and to hold a public meeting.",
    "format": "List the planets of the solar system as a Markdown table with columns name, order from the "
    "sun, type (rocky or giant) and one notable fact. Then add a one-line caption.",
    "json": "Return a JSON object describing a fictional bookshop: name, address (street, city, postcode), "
    "opening hours per weekday, and an array of five books with title, author, year and price.",
    "html": "Write a complete HTML5 page with inline CSS for a recipe card: a title, an ingredients list, "
    "numbered steps and a footer. Keep it accessible and valid.",
    "narrative": "Tell a story about a cartographer who finds a village missing from every map. Start "
    "in the middle of the action and end with a surprise.",
}

FOLLOW_UPS = (
    "Now make it shorter and give it a title.",
    "Explain the most important part of your answer again, more simply.",
)

CONTEXT_LOAD_MESSAGE = "Read the document above; questions follow."
ARENA_PROMPT = "Continue the text above with the next paragraph, in the same style."

_SUBJECTS = (
    "The harbour master",
    "A quiet engineer",
    "The old library",
    "Every spring the river",
    "The committee",
    "A travelling merchant",
    "The observatory",
    "Our neighbour",
    "The night train",
    "A young botanist",
)
_VERBS = (
    "recorded",
    "noticed",
    "described",
    "measured",
    "questioned",
    "rebuilt",
    "followed",
    "explained",
    "collected",
    "painted",
)
_OBJECTS = (
    "the changing tides along the northern coast",
    "a map of forgotten roads",
    "the price of bread in winter",
    "seven letters nobody had answered",
    "the sound of bells across the valley",
    "a machine made of brass",
    "the path of a comet",
    "the names of every ship in port",
    "a garden that grew in the dark",
    "the rules of a very old game",
)
_TAILS = (
    "before anyone else was awake.",
    "and wrote it all down.",
    "although the weather was against them.",
    "as the town slowly changed.",
    "with great patience.",
    "for reasons that became clear later.",
    "in a notebook with a green cover.",
    "while the lamps were lit one by one.",
)


def nonce() -> str:
    return secrets.token_hex(6)


def with_nonce(text: str, tag: str | None = None) -> str:
    """Prefix a unique nonce so no two requests share a cached prefix."""
    return f"[run {tag or nonce()}] {text}"


def filler(n_sentences: int, seed: int) -> str:
    """Deterministic, varied English text of about 12 tokens a sentence."""
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
        for _ in range(n_sentences)
    )
