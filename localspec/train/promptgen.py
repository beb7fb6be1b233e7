"""Builds localspec's own training prompt set (``localspec/data/train_prompts.jsonl``).

Templates x topics, deterministic (seeded), across chat, coding, math, writing, knowledge,
multi-turn, short and long prompts. The held-out bench prompts (``bench/heldout.jsonl``) use other
topics; :func:`build` refuses any overlap with them. Regenerate with
``python -m localspec.train.promptgen``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from ..core.atomic import atomic_write

CHAT_TOPICS = [
    "staying motivated when working from home", "making new friends after moving to a new city",
    "getting better sleep", "learning a new language as an adult", "planning a weekend camping trip",
    "saving money on groceries", "dealing with stress before an exam", "starting a vegetable garden",
    "choosing a first pet", "preparing for a job interview", "keeping a houseplant alive",
    "organizing a small apartment", "drinking more water during the day", "starting to run",
    "reducing screen time", "hosting a dinner party", "picking a good book to read",
    "traveling on a tight budget", "learning to cook simple meals", "writing a daily journal",
    "being more productive in the morning", "handling a disagreement with a coworker",
    "teaching a child to ride a bike", "decluttering a closet", "staying safe while hiking",
    "choosing a laptop for school", "taking better photos with a phone", "learning to play guitar",
    "meditating for beginners", "planning a birthday surprise", "reducing food waste",
    "volunteering in the community", "improving public speaking", "setting personal goals",
    "keeping in touch with old friends", "moving to a new house", "caring for an elderly parent",
    "starting a book club", "managing time as a student", "staying warm in winter",
    "cleaning a kitchen quickly", "choosing running shoes", "packing for a long flight",
    "building a morning routine", "learning to swim", "recycling at home", "visiting a museum",
    "writing a thank-you note", "practicing gratitude", "adopting a rescue dog",
]
CHAT_TEMPLATES = [
    "Can you give me some tips on {t}?", "What are the best ways to approach {t}?",
    "I need advice about {t}.", "How should I get started with {t}?",
    "What mistakes do people usually make with {t}?", "Give me a short checklist for {t}.",
    "My friend asked me about {t}. What should I tell them?", "Explain why {t} matters.",
    "What are three simple ideas for {t}?", "hey, any thoughts on {t}?",
]
KNOWLEDGE_TOPICS = [
    "photosynthesis", "the water cycle", "how vaccines work", "black holes", "the Roman Empire",
    "plate tectonics", "the human heart", "electricity", "the French Revolution", "volcanoes",
    "the immune system", "climate change", "the printing press", "DNA", "the solar system",
    "earthquakes", "the Industrial Revolution", "rainbows", "how airplanes fly", "the moon's phases",
    "bees and pollination", "the Great Wall of China", "magnets", "the internet", "ocean tides",
    "the Renaissance", "coral reefs", "gravity", "the pyramids of Egypt", "recycling plastic",
    "the periodic table", "deserts", "the brain", "sound waves", "rain forests", "the stock market",
    "inflation", "democracy", "the Olympic Games", "dinosaurs",
]
KNOWLEDGE_TEMPLATES = [
    "Explain {t} in simple terms.", "What is {t}?", "Tell me three interesting facts about {t}.",
    "How would you explain {t} to a ten-year-old?", "Write a short paragraph about {t}.",
    "Why is {t} important?", "Summarize what scientists or historians know about {t}.",
    "What are common misconceptions about {t}?",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "finds the largest element in a list", "counts the vowels in a string",
    "removes duplicates from a list", "merges two sorted lists", "computes Fibonacci numbers",
    "checks if a string is a palindrome", "sums the digits of an integer", "converts Celsius to Fahrenheit",
    "flattens a nested list", "counts word frequencies in a text", "sorts a list of dictionaries by a key",
    "reads a CSV file and prints each row", "finds the second smallest number in a list",
    "validates an email address with a regular expression", "computes the average of a list",
    "implements binary search", "capitalizes the first letter of each word", "computes the GCD of two numbers",
    "generates a random password", "transposes a matrix", "checks whether two strings are anagrams",
    "returns the n most common elements", "implements a stack class", "implements a queue with two stacks",
    "parses a date string", "rotates a list by k positions", "finds all even numbers in a list",
    "computes the running total of a list", "chunks a list into pieces of size n",
    "converts a decimal number to binary", "counts lines in a file", "finds the longest word in a sentence",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "Java", "C", "C++", "Rust", "Go", "Bash"]
CODE_TEMPLATES = [
    "Write a {lang} function that {t}.", "How do I write code in {lang} that {t}?",
    "Show me a short {lang} program that {t}, with comments.",
    "Write a {lang} function that {t} and explain how it works.",
    "Can you write a function in {lang} that {t}? Keep it simple.",
]
CODE_CONCEPTS = [
    "recursion", "a hash table", "object-oriented programming", "a linked list", "big O notation",
    "version control with git", "unit testing", "an API", "a race condition", "garbage collection",
    "a closure", "dynamic programming", "a REST endpoint", "exceptions", "list comprehensions",
    "pointers", "a database index", "SQL joins", "asynchronous code", "type hints",
]
CODE_CONCEPT_TEMPLATES = [
    "What is {t} in programming?", "Explain {t} with a small code example.",
    "When should I use {t}?", "What are the pros and cons of {t}?",
]
WRITING_SUBJECTS = [
    "a lighthouse keeper", "a lost kitten", "the first day of spring", "a robot learning to paint",
    "an old bookshop", "a storm at sea", "a child's first snow", "a dragon who is afraid of fire",
    "a city at night", "a forgotten letter", "a journey by train", "the last tree in a desert",
    "a baker who wakes up early", "a friendship between a fox and a crow", "a quiet library",
    "a mountain village", "the sound of rain", "an astronaut looking at Earth", "a grandmother's garden",
    "a runaway balloon", "a haunted clock", "summer holidays", "a street musician", "a lonely moon",
    "the ocean at dawn", "a clever mouse", "a time traveler's mistake", "an autumn walk",
]
WRITING_TEMPLATES = [
    "Write a short story about {t}.", "Write a poem about {t}.", "Write a haiku about {t}.",
    "Describe {t} in a few vivid sentences.", "Write the opening paragraph of a novel about {t}.",
    "Write a limerick about {t}.", "Write a children's story about {t}.",
]
PRACTICAL_WRITING = [
    "an email asking my manager for a day off", "a product description for a reusable water bottle",
    "a cover letter for a barista job", "a short speech for a friend's wedding",
    "a polite complaint to a landlord about a broken heater", "a birthday message for my sister",
    "an announcement for a school bake sale", "a review of a local pizza restaurant",
    "a LinkedIn summary for a software engineer", "an apology message to a friend",
    "a welcome message for new club members", "a short blog post about morning walks",
    "a text inviting friends to a picnic", "a thank-you email after an interview",
    "instructions for making tea", "a motivational message for a sports team",
]
PRACTICAL_TEMPLATES = ["Write {t}.", "Help me write {t}.", "Draft {t}, please.", "Can you write {t}? Keep it short."]
MATH_TEMPLATES = [
    "What is {a} + {b}?", "What is {a} times {b}?", "Calculate {a} minus {b}.",
    "What is {a} divided by {c}?", "What is {p}% of {a}?",
    "If a shirt costs ${a} and is discounted by {p}%, what is the new price?",
    "A train travels {a} km in {c} hours. What is its average speed?",
    "Solve for x: {c}x + {b} = {a}.", "What is the area of a rectangle {c} m wide and {d} m long?",
    "Tom has {a} apples and gives away {d}. How many are left?",
    "What is the square of {d}?", "Is {a} an even or odd number? Explain.",
    "A recipe needs {d} eggs for {c} people. How many eggs for {e} people?",
    "What is the perimeter of a square with side {d} cm?",
    "Convert {a} minutes to hours and minutes.", "What is the average of {d}, {e} and {c}?",
    "If I save ${d} every week, how much will I have after {e} weeks?",
    "Round {a}.{d} to the nearest whole number.", "What is {d} to the power of 3?",
    "A circle has radius {c}. What is its area?",
]
MATH_CONCEPTS = [
    "a prime number", "the Pythagorean theorem", "a fraction", "probability", "a derivative",
    "the mean, median and mode", "percentages", "a linear equation", "negative numbers", "pi",
    "an integral", "exponents", "a function", "a matrix", "standard deviation", "logarithms",
]
MATH_CONCEPT_TEMPLATES = ["Explain {t} with an example.", "What is {t}?", "How do I understand {t}?"]
LONG_TEXTS = [
    "The city council met on Tuesday to discuss the new bike lanes on Main Street. Some shop owners worried "
    "that fewer parking spaces would hurt their business, while cyclists said the lanes would make the street "
    "safer. After two hours of debate, the council agreed to test the lanes for six months and then review "
    "traffic and sales data before making a final decision.",
    "Our team spent the last quarter rebuilding the checkout page. Load times dropped from four seconds to "
    "under one second, and the number of abandoned carts fell by twelve percent. However, customers on older "
    "phones still report problems with the payment form, so the next quarter will focus on testing with more "
    "devices and simplifying the form fields.",
    "Honeybees communicate the location of flowers through a waggle dance. The angle of the dance relative to "
    "the vertical shows the direction of the food compared to the sun, and the length of the waggle run shows "
    "the distance. Other bees in the hive follow the dancer and then fly out to find the flowers themselves.",
    "I have been learning to bake bread for three months. My first loaves were dense and flat, but after I "
    "started measuring flour by weight and letting the dough rise longer in a warm place, the bread became "
    "light and airy. Now I want to try sourdough, but I am not sure how to start a starter.",
    "The library will close for renovations from June 1 to August 15. During this time, members can borrow "
    "books from the mobile library van, which will visit the town square every Saturday morning. All due dates "
    "will be extended, and no late fees will be charged during the closure.",
    "Maria opened a small cafe near the university. At first, few students came, because the prices were "
    "higher than the campus cafeteria. She started offering a discount for students who brought their own "
    "cups and hosted a quiet study hour every evening. Within a few months the cafe was full most afternoons.",
]
LONG_TEMPLATES = [
    "Summarize the following text in two sentences:\n\n{t}", "What is the main point of this text?\n\n{t}",
    "Rewrite this text in a more formal tone:\n\n{t}", "List the key facts in this text:\n\n{t}",
    "Write three questions a reader might ask about this text:\n\n{t}", "Translate the ideas of this text into a short poem:\n\n{t}",
]
SHORT_PROMPTS = [
    "Hi!", "Hello, how are you?", "What can you do?", "Tell me a joke.", "Good morning!",
    "Who are you?", "Thanks!", "What's your name?", "Give me a fun fact.", "Say something nice.",
    "What day comes after Monday?", "Name five fruits.", "List three colors.", "What is 2 + 2?",
    "Recommend a movie.", "Tell me a riddle.", "What should I eat for dinner?", "Give me a quote.",
]
MULTI_TURN = [
    ("What is a good name for a cat?", "How about Whiskers, Luna, or Oliver?", "I like Luna. Why is it popular?"),
    ("Can you help me plan a trip to Italy?", "Sure! How many days do you have and which cities interest you?",
     "I have five days and I want to see Rome and Florence."),
    ("I want to learn Python.", "Great choice! Do you have any programming experience?", "No, I'm a complete beginner. Where do I start?"),
    ("What's a healthy breakfast?", "Oatmeal with fruit, eggs with vegetables, or yogurt with nuts are good options.",
     "Which of those is fastest to make?"),
    ("Write a function that adds two numbers in Python.", "def add(a, b):\n    return a + b",
     "Now make it add a list of numbers instead."),
    ("What is 15 times 4?", "15 times 4 is 60.", "And what is that divided by 3?"),
    ("Tell me a story about a dog.", "Once upon a time, a small dog named Max found a shiny key in the park.",
     "Continue the story. What did the key open?"),
    ("I feel tired all the time.", "I'm sorry to hear that. How much sleep do you usually get?", "About five hours a night."),
    ("Recommend a book.", "You might enjoy 'The Hobbit' by J.R.R. Tolkien.", "I've read it. Something similar?"),
    ("How do I make pancakes?", "Mix flour, eggs, milk, sugar and baking powder, then cook on a hot pan.",
     "Can I make them without eggs?"),
    ("Explain what a variable is.", "A variable is a name that stores a value, like x = 5.", "Can a variable change its value?"),
    ("What's the capital of Japan?", "The capital of Japan is Tokyo.", "What is Tokyo famous for?"),
    ("Write a haiku about winter.", "Silent falling snow\nblankets the sleeping village\nwhite breath in the air",
     "Now write one about summer."),
    ("I'm starting a small business.", "Exciting! What kind of business is it?", "A small bakery. How do I find customers?"),
    ("What is the speed of light?", "About 300,000 kilometers per second.", "How long does light take to reach us from the sun?"),
    ("How can I learn to draw?", "Start with simple shapes, practice every day, and copy drawings you like.",
     "How long until I get good at it?"),
]
# A second, larger pool (stop 11): the first set had 50 chat topics, and held-out chat stayed at
# 1.7 tokens per cycle while topics seen in training read 2.8. More topics, more phrasings.
CHAT_TOPICS_2 = [
    "asking for a raise", "negotiating rent with a landlord", "writing a budget for the month",
    "paying off credit card debt", "opening a savings account", "buying a first home",
    "working a night shift", "taking a gap year", "choosing a college major", "studying for a driving test",
    "learning to type faster", "keeping a tidy desk", "packing lunch for work", "cooking for one person",
    "eating more vegetables", "cutting down on sugar", "drinking less coffee", "stretching after exercise",
    "starting yoga at home", "lifting weights safely", "walking ten thousand steps a day", "training for a 5k race",
    "recovering from a cold", "dealing with seasonal allergies", "protecting skin from the sun",
    "keeping teeth healthy", "taking care of your eyes while using screens", "sitting less during the day",
    "waking up without an alarm", "taking power naps", "winding down before bed", "keeping a bedroom cool",
    "potty training a toddler", "helping a child with homework", "choosing toys for a baby",
    "talking to teenagers about phones", "planning a family holiday", "setting chores for kids",
    "introducing a new cat to a dog", "training a puppy to sit", "feeding a goldfish", "walking a dog in the rain",
    "caring for a pet rabbit", "cleaning a bird cage", "finding a good veterinarian",
    "painting a bedroom", "fixing a leaky faucet", "hanging pictures on a wall", "unclogging a drain",
    "choosing curtains", "saving energy at home", "keeping a house cool in summer", "getting rid of ants",
    "washing a wool sweater", "ironing a shirt", "removing a coffee stain", "folding fitted sheets",
    "choosing a backpack for commuting", "learning to drive a manual car", "keeping a car clean",
    "taking the bus in a new city", "renting a car abroad", "surviving a long layover",
    "dealing with jet lag", "packing a carry-on bag", "visiting a national park", "planning a road trip",
    "staying at a hostel", "learning basic phrases before a trip", "exchanging money when traveling",
    "writing a resume", "asking a teacher for help", "joining a sports team", "finding a mentor",
    "switching careers at forty", "working in an open office", "running a team meeting",
    "giving feedback to a colleague", "answering emails faster", "taking breaks at work",
    "saying goodbye to coworkers", "working with a difficult boss", "preparing a presentation",
    "learning to knit", "starting a stamp collection", "baking cookies with kids", "growing herbs on a windowsill",
    "building a birdhouse", "learning chess", "doing a jigsaw puzzle", "starting to paint with watercolors",
    "writing poetry as a hobby", "singing in a choir", "learning to dance salsa", "taking up fishing",
    "keeping a reading habit", "listening to podcasts", "starting a blog", "making a photo album",
    "throwing a baby shower", "choosing a wedding gift", "planning a small wedding", "writing a wedding speech",
    "celebrating a friend's promotion", "cheering up a sad friend", "supporting a grieving friend",
    "apologizing after an argument", "meeting a partner's parents", "going on a first date",
    "living with roommates", "splitting bills with roommates", "being a good neighbor",
    "welcoming a new neighbor", "talking to a shy child", "making small talk at a party",
    "remembering people's names", "writing a condolence card", "asking for directions",
    "shopping at a farmers market", "buying a used phone", "choosing a mattress", "picking a winter coat",
    "returning an item to a store", "comparing phone plans", "avoiding online scams",
    "creating strong passwords", "backing up family photos", "cleaning up a cluttered inbox",
    "setting up a home Wi-Fi network", "learning to use a spreadsheet",
    "preparing for a power outage", "making a first aid kit", "staying calm in an emergency",
    "keeping a car ready for winter", "planting a tree", "composting food scraps", "using less plastic",
    "getting involved in local politics", "donating old clothes", "starting a neighborhood cleanup",
]
CHAT_TEMPLATES_2 = [
    "Any tips for {t}?", "I'd like some help with {t}.", "What's the easiest way to go about {t}?",
    "Where do I even begin with {t}?", "What do experts recommend for {t}?",
    "Could you walk me through {t} step by step?", "What should a beginner know about {t}?",
    "I'm bad at {t}. How can I improve?", "What are the biggest challenges of {t}?",
    "Quick question: what matters most when it comes to {t}?", "Give me a simple plan for {t}.",
    "How much time does {t} usually take?", "What's your advice on {t}?",
    "What would you suggest for someone who is nervous about {t}?",
]
SITUATIONS = [
    "just moved to a city where I don't know anyone", "have a big exam next week and can't focus",
    "keep procrastinating on a project", "feel lonely on weekends", "argued with my best friend",
    "have too many meetings at work", "want to quit my job but I'm scared",
    "can't decide between two apartments", "spend too much money on takeout", "have trouble waking up early",
    "forgot my friend's birthday", "get nervous when I speak in class", "have a noisy upstairs neighbor",
    "want to get back into exercise after a long break", "am starting university in the fall",
    "have a job interview tomorrow", "feel stuck in my career", "am planning to adopt a cat",
    "keep losing my keys", "have a messy garage", "want to learn to cook but have no time",
    "am going camping for the first time", "have to give a speech at work", "want to save for a vacation",
    "am hosting my in-laws for a week", "can't stop checking my phone", "have a toddler who won't sleep",
    "am training for my first marathon", "got a bad grade on a test", "am moving in with my partner",
    "feel tired after lunch every day", "want to make my small garden look nicer",
    "have a coworker who takes credit for my work", "am retiring next year", "want to read more books",
    "keep forgetting to drink water", "have a flight with a long layover", "want to write a novel",
    "am nervous about a dentist appointment", "have a friend who is always late",
]
SITUATION_TEMPLATES = [
    "I {t}. Any advice?", "I {t}. What should I do?", "I {t}. Can you help me think it through?",
    "So I {t}... any ideas?",
]
KNOWLEDGE_TOPICS_2 = [
    "how tornadoes form", "the life cycle of a butterfly", "how the heart pumps blood", "why the sky is blue",
    "how bread rises", "the history of the bicycle", "how a refrigerator works", "the Amazon river",
    "why leaves change color in autumn", "how batteries work", "the first moon landing", "how bees make honey",
    "what causes thunder", "the history of chocolate", "how a compass works", "why we dream",
    "the Silk Road", "how glaciers move", "why cats purr", "how solar panels work", "the Vikings",
    "how the ear hears sound", "the invention of the telephone", "what makes a desert", "how submarines dive",
    "the Maya civilization", "how fireworks get their colors", "why the ocean is salty", "how clouds form",
    "how the eye sees color", "how a bill becomes a law", "how muscles grow", "the planet Mars",
    "how a camera works", "the discovery of penicillin", "why we need sleep", "how trains stay on tracks",
    "the Great Barrier Reef", "how recycling works", "the history of writing",
]
KNOWLEDGE_TEMPLATES_2 = [
    "Can you explain {t}?", "I've always wondered about {t}. Can you explain it?",
    "Give me a short overview of {t}.", "Teach me about {t} in a few paragraphs.",
    "What are the key ideas behind {t}?",
]
WRITING_SUBJECTS_2 = [
    "a penguin who wants to fly", "a secret door in a school", "the last day of summer camp",
    "a knight who is afraid of the dark", "a garden that grows at night", "a message in a bottle",
    "a bakery run by cats", "a snowman who wants to see summer", "an island with no name",
    "a painter who loses her colors", "a bridge between two villages", "a kite caught in a tree",
    "a whale singing in the deep sea", "a bus driver's ordinary day", "a forest after a fire",
    "a detective who is a dog", "a wishing well", "a shy giant", "a city under the sea",
    "an old man and his boat", "a firefly lost in a city", "a tiny house on a hill",
    "a robot who wants a friend", "a music box", "the first snowfall in the mountains",
    "a sunflower field", "a train that never stops", "a lantern in the fog",
    "a girl who can talk to birds", "a squirrel preparing for winter",
]
WRITING_TEMPLATES_2 = [
    "Write a short poem about {t}.", "Tell me a story about {t}.", "Write a bedtime story about {t}.",
    "Write a four-line rhyme about {t}.", "Write a very short story (under 150 words) about {t}.",
    "Write a scene about {t}.",
]
PRACTICAL_WRITING_2 = [
    "a note to my child's teacher about a missed day", "a short bio for a conference", "a toast for my brother's birthday",
    "an out-of-office reply", "a message asking a neighbor to water my plants", "a thank-you card for a teacher",
    "a request for a refund from an online shop", "a reminder email about a team deadline",
    "an invitation to a book club meeting", "a short ad for a lost dog", "a farewell message for a retiring colleague",
    "a recommendation for a former intern", "a reply declining a meeting invitation",
    "a post announcing a new cafe opening", "a text to reschedule a dinner", "a get-well-soon card",
    "a letter to a pen pal", "a short speech for a school graduation", "a message congratulating a friend on a new baby",
    "a note to thank a neighbor for help",
]

CHAT_TOPICS_3 = [
    "keeping a conversation going on the phone", "choosing a gym membership", "getting along with a new stepparent",
    "making friends at a new school", "keeping plants alive while on vacation", "planning meals for a busy week",
    "starting a small side business", "selling old furniture online", "preparing a child for a new sibling",
    "visiting a friend in the hospital", "taking care of a sunburn", "dealing with a noisy roommate",
    "choosing a name for a pet", "throwing a surprise party on a budget", "keeping a long-distance friendship alive",
    "finding a hobby you enjoy", "cooking rice properly", "storing fresh herbs", "making coffee at home",
    "choosing a good watermelon", "packing a picnic", "planning a kids' birthday party", "writing a grocery list",
    "learning to juggle", "taking notes in a lecture", "reading faster", "memorizing a poem", "learning to draw faces",
    "keeping a bullet journal", "getting organized before school starts", "choosing a summer job",
    "preparing for a parent-teacher meeting", "helping a friend move", "hosting a game night", "planning a picnic",
    "staying focused while studying at home", "finding quiet time as a parent", "sharing a car with family",
    "teaching a dog to walk on a leash", "bathing a cat", "keeping chickens in a backyard", "choosing an aquarium",
    "calming a nervous dog during storms", "building a snowman", "staying active in winter", "enjoying a beach day safely",
    "choosing sunglasses", "picking a tent for camping", "cooking over a campfire", "reading a trail map",
    "looking after a sick child", "taking medicine on time", "going to the doctor for a checkup",
    "preparing for a blood test", "keeping a food diary", "eating breakfast every day", "making healthy snacks",
    "cooking with leftovers", "baking bread for the first time", "making soup from scratch", "setting a nice table",
    "being a good houseguest", "writing a letter to your future self", "celebrating a small win",
    "dealing with a bad day", "staying positive during a long project", "asking for help when you need it",
    "spending less time on social media", "keeping a secret for a friend", "meeting new people online safely",
    "planning a reunion", "organizing family photos", "recording family stories", "talking to grandparents about the past",
    "choosing a charity to support", "starting to recycle at work", "reducing noise at home", "making a room feel cozy",
    "choosing a paint color", "arranging furniture in a small room", "walking to work", "carpooling with coworkers", "taking a train trip",
    "booking a cheap flight", "choosing a hotel", "traveling with a baby", "traveling alone for the first time",
    "writing postcards while traveling", "keeping a travel journal", "learning about a new culture before a visit",
    "tipping in restaurants abroad", "eating out with food allergies", "ordering at a fancy restaurant",
    "cooking a holiday dinner", "decorating for a holiday", "wrapping presents neatly", "choosing a gift for a coworker",
    "budgeting for holiday gifts", "making a homemade card", "writing in a birthday card", "planning a date night at home",
    "keeping a relationship strong", "dividing housework fairly", "talking about money with a partner",
    "planning for retirement early", "teaching kids about money", "starting an emergency fund", "tracking daily spending",
    "choosing a bank", "understanding a phone bill", "canceling unused subscriptions", "shopping for groceries online",
    "finding deals on clothes", "caring for leather shoes", "sewing on a button", "choosing clothes for an interview",
    "dressing for cold weather", "doing laundry less often", "cleaning windows without streaks", "keeping a bathroom clean",
    "getting rid of bad smells in a fridge", "organizing a pantry", "labeling storage boxes", "cleaning out a garage",
    "preparing a garden for spring", "watering plants correctly", "growing tomatoes", "attracting birds to a garden",
    "mowing a lawn", "raking leaves", "shoveling snow safely", "keeping pipes from freezing",
    "changing a light bulb safely", "using a drill for the first time", "assembling flat-pack furniture",
    "picking a good flashlight", "charging a phone battery properly", "keeping a laptop running fast",
    "choosing headphones", "taking care of a new phone", "printing documents at home", "using a video call for the first time",
]
CHAT_TEMPLATES_3 = [
    "What are some good ideas for {t}?", "Can you help me with {t}?", "I'm new to {t}. Where should I start?",
    "What do I need to know about {t}?", "Do you have any advice on {t}?", "What's the best approach to {t}?",
    "Any suggestions for {t}?", "How do people usually handle {t}?", "What are the dos and don'ts of {t}?",
    "Tell me how to get better at {t}.", "I keep struggling with {t}. Any tips?", "What should I avoid when it comes to {t}?",
]
HOW_TO = [
    "stop overthinking small decisions", "make a good first impression", "keep my room clean",
    "stay calm when someone is rude to me", "cheer up a friend who is having a hard week", "make my mornings less rushed",
    "remember what I read", "get better at making decisions", "stay in touch with family who live far away",
    "make a boring task more fun", "be more patient with my kids", "start a conversation with a stranger",
    "ask my neighbor to turn down the music", "tell my friend they hurt my feelings", "stay focused during long meetings",
    "feel less nervous before a test", "stop biting my nails", "keep a plant alive in a dark room", "spend a day off well",
    "make the most of a long weekend", "be more confident at work", "handle criticism better", "stop comparing myself to others",
    "say thank you in a meaningful way", "plan a day trip with friends", "find time to exercise", "eat healthier at work",
    "keep my kids busy during summer break", "make a small kitchen work better", "keep my car from getting messy",
    "enjoy cooking more", "sleep on a long flight", "relax after a stressful day", "make friends as an adult",
    "ask for a day off",
    "split a restaurant bill fairly", "keep a New Year's resolution", "get back on track after a bad week",
    "prepare my house for guests", "choose what to cook for dinner", "keep my phone from dying", "save money on heating",
    "spend less on coffee", "plan a trip with a group", "keep a journal every day", "learn something new every week",
    "stop hitting snooze", "become a morning person", "work from a cafe productively", "keep my desk organized",
    "make my resume stand out", "follow up after a job interview", "prepare for my first day at a new school",
    "introduce myself in a meeting", "give a compliment without sounding awkward", "end a phone call politely",
    "say sorry to my sister", "encourage my friend to see a doctor", "help my dad learn to use his phone",
    "get my teenager to talk to me", "keep my dog from barking at the door", "choose a good restaurant in a new town",
    "prepare for a hot summer", "keep my house safe while I'm away", "enjoy a museum visit with kids",
    "pack for a weekend away", "stay healthy while traveling", "make a long drive less boring",
]
HOW_TO_TEMPLATES = [
    "How do I {t}?", "How can I {t}?", "What's a good way to {t}?", "Is there a trick to help me {t}?",
    "What's the best way to {t}?", "Any advice on how to {t}?", "I want to {t}. What do you suggest?",
]
THINGS_TO_DO = [
    "on a snowy afternoon", "with a group of teenagers", "at home on a Friday night", "with grandparents",
    "on a sunny Saturday", "during a long car trip", "in a small town",
    "on a budget in a big city", "when you can't sleep", "with friends who don't drink", "at the beach in autumn",
    "with a new puppy", "during a power cut", "while waiting at an airport", "with a visiting cousin",
    "on a first date", "on a family day out", "after school",
]
THINGS_TEMPLATES = [
    "What are some fun things to do {t}?", "Give me ideas for things to do {t}.", "What can we do {t}?",
]
MATH_TEMPLATES_2 = [
    "What is {b} times {e}?", "Subtract {b} from {a}.", "What is {a} plus {b} plus {d}?",
    "A bus carries {d} people on each trip. How many people does it carry in {e} trips?",
    "What is {p} percent of {b}?", "Solve for n: n - {d} = {b}.",
    "What is the perimeter of a rectangle that is {d} cm by {e} cm?",
    "A book costs ${d} and a pen costs ${c}. How much do {c} books and {e} pens cost?",
    "If {c} friends share {a} stickers equally, how many does each get and how many are left over?",
    "How many seconds are there in {e} minutes?", "What is half of {a}?", "Write {p}% as a fraction in lowest terms.",
    "A garden is {d} m long and {e} m wide. What is its area?", "Which is bigger, {c}/{d} or {e}/{b}? Explain.",
    "I read {d} pages a day. How many days will a {a}-page book take?",
]

SYSTEMS = [None, None, None, None, "You are a helpful assistant.", "You are a friendly and concise assistant.",
           "You are a patient teacher."]


def _math_values(rng: random.Random) -> dict:
    return {"a": rng.randint(12, 480), "b": rng.randint(2, 99), "c": rng.randint(2, 9), "d": rng.randint(3, 30),
            "e": rng.randint(2, 20), "p": rng.choice([5, 10, 15, 20, 25, 30, 40, 50])}


def build(seed: int = 0, *, full: bool = False) -> list[dict]:
    """The prompt set; ``full``: every template with every topic instead of a sample of them."""
    rng = random.Random(seed)

    def pick(templates: list[str], n: int) -> list[str]:
        return list(templates) if full else rng.sample(templates, n)
    items: list[dict] = []

    def add(category: str, prompt: str, *, history: tuple = (), group: str | None = None) -> None:
        items.append(_item(rng, category, prompt, group or prompt, history))

    for t in CHAT_TOPICS:
        for tpl in pick(CHAT_TEMPLATES, 5):
            add("chat", tpl.format(t=t), group=t)
    for t in KNOWLEDGE_TOPICS:
        for tpl in pick(KNOWLEDGE_TEMPLATES, 4):
            add("knowledge", tpl.format(t=t), group=t)
    for t in CODE_TASKS:
        for tpl in pick(CODE_TEMPLATES, 3):
            add("coding", tpl.format(t=t, lang=rng.choice(LANGUAGES)), group=t)
    for t in CODE_CONCEPTS:
        for tpl in CODE_CONCEPT_TEMPLATES:
            add("coding", tpl.format(t=t), group=t)
    for t in WRITING_SUBJECTS:
        for tpl in pick(WRITING_TEMPLATES, 4):
            add("writing", tpl.format(t=t), group=t)
    for t in PRACTICAL_WRITING:
        for tpl in pick(PRACTICAL_TEMPLATES, 2):
            add("writing", tpl.format(t=t), group=t)
    for tpl in MATH_TEMPLATES:
        for _ in range(8):
            add("math", tpl.format(**_math_values(rng)), group=tpl)
    for t in MATH_CONCEPTS:
        for tpl in MATH_CONCEPT_TEMPLATES:
            add("math", tpl.format(t=t), group=t)
    for i, t in enumerate(LONG_TEXTS):
        for tpl in LONG_TEMPLATES:
            add("long", tpl.format(t=t), group=f"text {i}")
    for p in SHORT_PROMPTS:
        add("short", p)
    for first, reply, follow in MULTI_TURN:
        add("multi-turn", follow, history=(first, reply), group=first)
    # multi-turn built from the single-turn pools: a first question, a brief canned answer, a follow-up
    follow_ups = ["Can you explain that in more detail?", "Can you make it shorter?", "Give me an example.",
                  "Why is that?", "What else should I know?", "Can you summarize that in one sentence?"]
    for t in rng.sample(CHAT_TOPICS, 30) + rng.sample(KNOWLEDGE_TOPICS, 20):
        add("multi-turn", rng.choice(follow_ups), history=(f"Tell me about {t}.", f"Sure, here is a short overview of {t}."),
            group=t)
    _dedup_shuffle(items, rng)
    return items


def build_more(seed: int = 2) -> list[dict]:
    """The second pool (more chat topics, first-person situations, knowledge, writing)."""
    rng = random.Random(seed)
    items = _topic_pools(rng, [("chat", CHAT_TOPICS_2, CHAT_TEMPLATES_2, 4), ("chat", SITUATIONS, SITUATION_TEMPLATES, 3),
                               ("knowledge", KNOWLEDGE_TOPICS_2, KNOWLEDGE_TEMPLATES_2, 3),
                               ("writing", WRITING_SUBJECTS_2, WRITING_TEMPLATES_2, 3),
                               ("writing", PRACTICAL_WRITING_2, PRACTICAL_TEMPLATES, 2)])
    _dedup_shuffle(items, rng)
    return items


def build_third(seed: int = 3) -> list[dict]:
    """The third pool: everyday chat in more phrasings ("how do I ...", "things to do ..."), and
    more arithmetic word problems."""
    rng = random.Random(seed)
    items = _topic_pools(rng, [("chat", CHAT_TOPICS_3, CHAT_TEMPLATES_3, 4), ("chat", HOW_TO, HOW_TO_TEMPLATES, 4),
                               ("chat", THINGS_TO_DO, THINGS_TEMPLATES, 0)])
    for tpl in MATH_TEMPLATES_2:
        for _ in range(10):
            items.append(_item(rng, "math", tpl.format(**_math_values(rng)), tpl))
    _dedup_shuffle(items, rng)
    return items


def _topic_pools(rng: random.Random, pools) -> list[dict]:
    """(category, topics, templates, n) -> each topic in n of the templates drawn at random (all when 0)."""
    items = []
    for category, topics, templates, n in pools:
        for t in topics:
            for tpl in (rng.sample(templates, n) if n else templates):
                items.append(_item(rng, category, tpl.format(t=t), t))
    return items


def _item(rng: random.Random, category: str, prompt: str, group: str, history: tuple = ()) -> dict:
    """One prompt: a random system prompt (or none), earlier turns, the user's message."""
    messages = []
    system = rng.choice(SYSTEMS)
    if system:
        messages.append({"role": "system", "content": system})
    for i, text in enumerate(history):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    messages.append({"role": "user", "content": prompt})
    return {"category": category, "messages": messages, "group": f"{category}:{group}"}


def _unique(items: list[dict]) -> list[dict]:
    """The items without repeated conversations, first one kept."""
    seen, unique = set(), []
    for it in items:
        key = json.dumps(it["messages"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(it)
    return unique


def _dedup_shuffle(items: list[dict], rng: random.Random) -> None:
    rng.shuffle(items)
    items[:] = _unique(items)


def default_set() -> list[dict]:
    """The shipped set: the sampled one, then every template with every topic (other system
    prompts and numbers), then the second and third pools, without repeats."""
    return _unique(build() + build(1, full=True) + build_more() + build_third())


def main() -> None:
    out = Path(__file__).resolve().parent.parent / "data" / "train_prompts.jsonl"
    items = default_set()
    heldout = Path(__file__).resolve().parents[2] / "bench" / "heldout.jsonl"
    if heldout.is_file():
        held = {json.loads(line)["prompt"] for line in heldout.read_text().splitlines() if line.strip()}
        texts = {m["content"] for it in items for m in it["messages"]}
        overlap = held & texts
        if overlap:
            raise SystemExit(f"held-out prompts overlap the training set: {sorted(overlap)[:3]}")
    atomic_write(out, "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))
    print(f"{len(items)} prompts -> {out}")


if __name__ == "__main__":
    main()
