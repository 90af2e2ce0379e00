# Copyright 2026 The transformers-mtp authors. Licensed under the Apache License, Version 2.0.
"""A varied training prompt set for self-distillation, generated from templates (nothing is downloaded).

It covers code in several languages (functions, classes, SQL, concepts), explanations for several audiences, how-tos,
recipes, history, tips, plans, letters and emails, stories and poems, comparisons, definitions, summaries and
rewrites. It is deterministic for a seed. No prompt equals a benchmark prompt (`bench_prompts.jsonl`; a test checks
it), and the templates avoid the benchmark's requests (a palindrome check, FizzBuzz, binary search, a stack class,
photosynthesis, sleep tips, ...), so the benchmark measures the heads on requests they were not trained on.
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


# --- the extended set: more tasks, kinds and phrasings (about 800 prompts) -----------------------------------------
CODE_TASKS_2 = [
    "inserts values into a binary search tree and prints them in order",
    "sorts a list of people by age and then by name",
    "implements bubble sort",
    "implements merge sort",
    "reads a JSON file and prints one field of every record",
    "computes the first n Fibonacci numbers iteratively",
    "converts a Roman numeral to an integer",
    "finds the second largest number in an array",
    "checks whether the brackets in a string are balanced",
    "computes the average of the numbers in a file, one per line",
    "transposes a matrix",
    "capitalizes the first letter of every word in a sentence",
    "counts how many times each item occurs in a list and returns the counts",
    "checks whether a year is a leap year",
    "converts a binary string to a decimal number",
]
CODE_LANGUAGES_2 = ["Python", "JavaScript", "Java", "Go", "Rust", "C++"]
CODE_TEMPLATES_2 = [
    "Write {lang} code that {task}, and explain how it works.",
    "Can you write a {lang} function that {task}?",
    "Give me a short {lang} example that {task}.",
]
SQL_TASKS = [
    "lists the employees who earn more than their manager", "counts the orders placed in each month",
    "finds duplicate email addresses in a users table", "returns the average salary per department",
    "deletes log rows older than 30 days", "joins a products table with a categories table",
    "finds the customers who never placed an order", "returns the ten most recent blog posts with their authors",
]
SQL_TEMPLATES = ["Write an SQL query that {task}.", "How do I write a SQL statement that {task}?"]
CLASSES = [
    ("Queue", "enqueue, dequeue and size methods"), ("BankAccount", "deposit, withdraw and balance methods"),
    ("Rectangle", "area and perimeter methods"), ("Counter", "increment, decrement and reset methods"),
    ("TodoList", "add, remove and list methods"), ("Temperature", "conversions between Celsius and Kelvin"),
]
CLASS_LANGUAGES = ["Python", "Java", "C++", "TypeScript"]
CLASS_TEMPLATE = "Write a {lang} class {name} with {members}."
CONCEPTS = [
    "recursion", "a closure", "a list comprehension", "a generator", "async and await", "a pointer",
    "an interface", "a decorator", "a hash table", "big-O notation", "unit testing", "exception handling",
]
CONCEPT_TEMPLATE = "Explain what {concept} is in programming, with a short {lang} example."
CONCEPT_LANGUAGES = ["Python", "JavaScript", "Java"]
GOALS = [
    "get better at public speaking", "eat more vegetables", "spend less time on my phone", "learn to draw",
    "keep a journal", "become more organized at work", "learn to swim as an adult", "drink more water",
    "stop procrastinating", "improve my handwriting", "read more books", "remember people's names",
    "make my apartment feel cozy", "start meditating", "get along with a difficult coworker",
    "learn basic car maintenance", "make my mornings less rushed", "improve my posture", "write better emails",
    "get started with photography",
]
GOAL_TEMPLATES = ["How can I {goal}?", "What are some practical ways to {goal}?", "I want to {goal}. Where do I start?"]
DISHES = [
    "pancakes", "a vegetable soup", "guacamole", "fried rice", "banana bread", "a simple omelette", "hummus",
    "a chicken curry", "a green salad with a lemon dressing", "chocolate chip cookies", "lentil stew",
    "mashed potatoes", "a fruit smoothie", "garlic bread", "a vegetable stir-fry",
]
DISH_TEMPLATES = ["How do I make {dish}?", "Give me an easy recipe for {dish}."]
EVENTS = [
    "the First World War", "the fall of the Roman Empire", "the Great Depression", "the American Civil War",
    "the Industrial Revolution", "the Cold War", "the Renaissance", "the moon landing", "the Black Death",
    "the fall of the Berlin Wall", "the invention of the telephone", "the Protestant Reformation",
]
EVENT_TEMPLATES = [
    "What were the main causes of {event}?", "Summarize {event} in a few sentences.",
    "What were the most important consequences of {event}?",
]
AUDIENCES = ["a child", "a high school student", "someone who has never studied science"]
AUDIENCE_TEMPLATE = "Explain {topic} to {audience}."
TIP_SUBJECTS = [
    "staying hydrated", "learning to code", "saving energy at home", "writing clearly", "studying math",
    "traveling on a budget", "taking better photos with a phone", "running a good meeting", "working from home",
    "keeping a tidy desk", "learning vocabulary", "cycling in a city", "hosting a dinner party", "moving house",
    "staying warm in winter", "choosing a laptop",
]
TIP_TEMPLATES = ["Give me three tips for {subject}.", "What are your best tips for {subject}?"]
PLANS = [
    "a weekly meal plan for a vegetarian", "a simple evening stretching routine", "a study schedule for a busy week",
    "a weekend cleaning routine", "a beginner's plan to run five kilometres", "a relaxing Sunday",
    "a packing list for a camping trip", "a plan for a child's birthday party",
]
PLAN_TEMPLATE = "Describe {plan}."
CITIES = ["Rome", "Tokyo", "Paris", "New York", "Barcelona", "Lisbon", "Istanbul", "Kyoto", "Prague", "Mexico City"]
TRIP_TEMPLATE = "Plan a three-day trip to {city}."
EMAIL_PURPOSES = [
    "thanking a customer for their order", "reminding my team about a meeting tomorrow",
    "asking a professor for a recommendation letter", "following up after a job application",
    "inviting colleagues to a farewell lunch", "telling a client that a project will be late",
    "asking a neighbour to keep the noise down", "welcoming a new member to a book club",
    "asking a shop whether an item is back in stock", "cancelling a gym membership",
]
EMAIL_TEMPLATES = ["Write a short, friendly email {purpose}.", "Write a professional message {purpose}."]
SUBJECTS = [
    "a lost dog finding its way home", "a robot learning to paint", "the first day at a new school",
    "a lighthouse keeper", "a dragon who is afraid of fire", "an old tree in a city park", "the ocean at night",
    "a rainy Monday", "a friendship between a cat and a crow", "a trip to the mountains",
]
CREATIVE_TEMPLATES = ["Write a short story about {subject}.", "Write a short poem about {subject}."]
DIFFERENCES = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("speed", "velocity"), ("a loan", "a grant"),
    ("an alligator", "a crocodile"), ("HTTP", "HTTPS"), ("RAM", "storage"), ("a simile", "a metaphor"),
    ("stocks", "bonds"), ("a comet", "an asteroid"), ("baking soda", "baking powder"), ("a lake", "a pond"),
]
DIFFERENCE_TEMPLATE = "What is the difference between {a} and {b}?"
TERMS = [
    "opportunity cost", "photosphere", "machine translation", "a carbon footprint", "biodiversity", "an API",
    "a mortgage", "open source software", "a placebo", "supply and demand", "a haiku", "the greenhouse effect",
]
TERM_TEMPLATE = "What does {term} mean? Give an example."
BOOKS = [
    "Romeo and Juliet", "Pride and Prejudice", "The Odyssey", "Moby-Dick", "Frankenstein", "The Little Prince",
    "Don Quixote", "Alice's Adventures in Wonderland", "Hamlet", "The Hobbit",
]
BOOK_TEMPLATE = "Summarize the plot of {book}."
SENTENCES = [
    "hey, can u send me the file asap", "the meeting got moved cause the boss was sick",
    "we ain't got no time for this", "i think the app is kinda broken", "thx for the help yesterday",
    "sorry i was late, traffic was crazy", "the food was ok but way too expensive", "pls fix the printer",
]
REWRITE_TEMPLATE = 'Rewrite this sentence so that it sounds formal: "{sentence}"'


def _fill(kind, templates, **lists):
    """Every template filled with every combination of the lists' values, templates outermost."""
    names = list(lists)
    for template in templates:
        for values in itertools.product(*lists.values()):
            yield {"kind": kind, "prompt": template.format(**dict(zip(names, values)))}


def _core_prompts():
    return [
        *_fill("code", CODE_TEMPLATES, lang=LANGUAGES, task=CODE_TASKS),
        *_fill("explain", EXPLAIN_TEMPLATES, topic=TOPICS),
        *_fill("howto", HOWTO_TEMPLATES, task=HOWTO_TASKS),
        *_fill("list", LIST_TEMPLATES, things=LIST_THINGS),
        *_fill("letter", LETTER_TEMPLATES, task=LETTER_TASKS),
        *({"kind": "compare", "prompt": template.format(a=a, b=b)}
          for template, (a, b) in itertools.product(COMPARE_TEMPLATES, PAIRS)),
    ]


def _extended_prompts():
    return [
        *_fill("code", CODE_TEMPLATES_2, lang=CODE_LANGUAGES_2, task=CODE_TASKS_2),
        *_fill("code", SQL_TEMPLATES, task=SQL_TASKS),
        *({"kind": "code", "prompt": CLASS_TEMPLATE.format(lang=lang, name=name, members=members)}
          for lang, (name, members) in itertools.product(CLASS_LANGUAGES, CLASSES)),
        *_fill("concept", [CONCEPT_TEMPLATE], concept=CONCEPTS, lang=CONCEPT_LANGUAGES),
        *_fill("howto", GOAL_TEMPLATES, goal=GOALS),
        *_fill("recipe", DISH_TEMPLATES, dish=DISHES),
        *_fill("history", EVENT_TEMPLATES, event=EVENTS),
        *_fill("explain", [AUDIENCE_TEMPLATE], topic=TOPICS, audience=AUDIENCES),
        *_fill("list", TIP_TEMPLATES, subject=TIP_SUBJECTS),
        *_fill("plan", [PLAN_TEMPLATE], plan=PLANS),
        *_fill("plan", [TRIP_TEMPLATE], city=CITIES),
        *_fill("letter", EMAIL_TEMPLATES, purpose=EMAIL_PURPOSES),
        *_fill("creative", CREATIVE_TEMPLATES, subject=SUBJECTS),
        *({"kind": "compare", "prompt": DIFFERENCE_TEMPLATE.format(a=a, b=b)} for a, b in DIFFERENCES),
        *_fill("define", [TERM_TEMPLATE], term=TERMS),
        *_fill("summary", [BOOK_TEMPLATE], book=BOOKS),
        *_fill("rewrite", [REWRITE_TEMPLATE], sentence=SENTENCES),
    ]


def _balanced(prompts, seed):
    """Shuffled deterministically, then taken round-robin by kind, so that no kind dominates a prefix."""
    prompts = list(prompts)
    random.Random(seed).shuffle(prompts)
    by_kind = {}
    for prompt in prompts:
        by_kind.setdefault(prompt["kind"], []).append(prompt)
    return [p for group in itertools.zip_longest(*by_kind.values()) for p in group if p is not None]


CORE_PREFIX = 640  # the first heads were trained on these; keeping them first keeps earlier data caches valid


def training_prompts(*, seed=0, limit=None):
    """
    Every template filled with every value (about 2,000 prompts), ordered so that any prefix is varied: the first 640
    core prompts (the first release's training set), then the extended set and the rest of the core set, each taken
    round-robin by kind (code prompts dominate the template products and would otherwise fill whole prefixes).
    """
    core = _balanced(_core_prompts(), seed)
    prompts = core[:CORE_PREFIX] + _balanced(_extended_prompts() + core[CORE_PREFIX:], seed)
    return prompts[:limit] if limit else prompts
