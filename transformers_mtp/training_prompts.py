# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""A varied training prompt set for self-distillation, generated from templates (nothing is downloaded).

It covers code in several languages, explanations, how-tos, lists, letters, comparisons and rewrites. It is
deterministic for a seed, and no prompt equals one of the benchmark prompts (`bench_prompts.jsonl`); a test checks it.
"""

import itertools
import random

LANGUAGES = ["Python", "JavaScript", "TypeScript", "Java", "C", "C++", "Go", "Rust", "Ruby", "bash", "SQL", "C#"]
CODE_TASKS = [
    "reads a text file and counts how often each word appears",
    "returns the largest and smallest value in a list",
    "checks whether a number is prime",
    "merges two sorted arrays into one sorted array",
    "converts a temperature from Celsius to Fahrenheit",
    "removes duplicate items from a list while keeping their order",
    "computes the factorial of a number recursively",
    "validates that a password has at least eight characters and one digit",
    "parses a CSV line into fields",
    "finds the most common character in a string",
    "sums the digits of an integer",
    "returns the n-th triangular number",
    "rotates an array to the right by k positions",
    "counts the vowels in a sentence",
    "checks whether two strings are anagrams",
    "flattens a nested list",
    "computes the greatest common divisor of two numbers",
    "generates the first n rows of Pascal's triangle",
    "formats a number of seconds as hours, minutes and seconds",
    "implements a simple queue with enqueue and dequeue",
]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Show me how to write a program in {lang} that {task}.",
    "In {lang}, implement a function that {task}. Add short comments.",
    "I need {lang} code that {task}. Please keep it simple.",
]
TOPICS = [
    "volcanoes", "the water cycle", "black holes", "vaccines", "the stock market", "recycling", "the immune system",
    "electric cars", "the moon's phases", "inflation", "earthquakes", "the internet", "democracy", "bees",
    "solar panels", "the Roman Empire", "climate change", "DNA", "rainbows", "compound interest", "machine learning",
    "the printing press", "coral reefs", "tides", "the human heart", "antibiotics", "glaciers", "music theory",
]
EXPLAIN_TEMPLATES = [
    "Explain {topic} in simple terms.",
    "What is the most important thing to know about {topic}?",
    "Describe how {topic} works, in a short paragraph.",
    "Give me three interesting facts about {topic}.",
    "Why does {topic} matter? Answer briefly.",
]
HOWTO_TASKS = [
    "learn a new language", "start running", "keep houseplants alive", "write a good resume", "save money on food",
    "organize a small kitchen", "study for an exam", "change a flat bicycle tire", "make friends in a new city",
    "plan a birthday party", "start a vegetable garden", "reduce screen time", "give a short speech",
    "clean a laptop keyboard", "brew good coffee at home", "train a puppy to sit", "write a short story",
    "prepare for a long flight", "learn to play the guitar", "back up photos",
]
HOWTO_TEMPLATES = ["How do I {task}?", "Give me step-by-step instructions to {task}.", "What is a good way to {task}?"]
LIST_THINGS = [
    "healthy breakfast ideas", "board games for families", "ways to stay focused", "classic novels",
    "questions to ask in an interview", "cheap hobbies", "things to pack for a beach day", "rainy day activities",
    "ways to reduce stress", "famous scientists", "tips for remote work", "vegetables that grow fast",
]
LIST_TEMPLATES = ["List five {things}.", "Give me a short list of {things}.", "What are some {things}? Use a list."]
LETTER_TASKS = [
    "thank a teacher", "complain politely about a late delivery", "invite a neighbour to dinner",
    "ask a landlord to fix the heating", "apologise to a friend for missing their party",
    "congratulate a colleague on a promotion", "request a refund for a broken product",
    "introduce myself to a new team", "decline a job offer politely", "ask for a deadline extension",
]
LETTER_TEMPLATES = ["Write a short letter to {task}.", "Draft a brief email to {task}."]
PAIRS = [
    ("cats", "dogs"), ("tea", "coffee"), ("trains", "planes"), ("books", "films"), ("Python", "JavaScript"),
    ("renting", "buying a home"), ("summer", "winter"), ("cities", "the countryside"), ("SQL", "NoSQL databases"),
]
COMPARE_TEMPLATES = ["Compare {a} and {b}.", "What are the pros and cons of {a} versus {b}?"]


def training_prompts(*, seed=0, limit=None):
    """Every template filled with every value, shuffled deterministically: about 1,100 prompts."""
    prompts = []
    for template, lang, task in itertools.product(CODE_TEMPLATES, LANGUAGES, CODE_TASKS):
        prompts.append({"kind": "code", "prompt": template.format(lang=lang, task=task)})
    for template, topic in itertools.product(EXPLAIN_TEMPLATES, TOPICS):
        prompts.append({"kind": "explain", "prompt": template.format(topic=topic)})
    for template, task in itertools.product(HOWTO_TEMPLATES, HOWTO_TASKS):
        prompts.append({"kind": "howto", "prompt": template.format(task=task)})
    for template, things in itertools.product(LIST_TEMPLATES, LIST_THINGS):
        prompts.append({"kind": "list", "prompt": template.format(things=things)})
    for template, task in itertools.product(LETTER_TEMPLATES, LETTER_TASKS):
        prompts.append({"kind": "letter", "prompt": template.format(task=task)})
    for template, (a, b) in itertools.product(COMPARE_TEMPLATES, PAIRS):
        prompts.append({"kind": "compare", "prompt": template.format(a=a, b=b)})
    random.Random(seed).shuffle(prompts)
    # Code prompts dominate the product above (960 of them); keep the kinds balanced by taking them round-robin.
    by_kind = {}
    for prompt in prompts:
        by_kind.setdefault(prompt["kind"], []).append(prompt)
    balanced = [p for group in itertools.zip_longest(*by_kind.values()) for p in group if p is not None]
    return balanced[:limit] if limit else balanced
