"""Grade-school arithmetic word problems from flashdraft's own templates (`packaged:word_problems`).

A draft learns the target's answers to the prompts it is trained on, so it drafts well where its
training prompts look like the traffic it will serve. For math word problems the public sets are
either not installable offline (GSM8K's train split) or rewrites of GSM8K test questions
(reasoning-gym's `gsm_symbolic`), which would leak into a GSM8K evaluation. These templates are written
here: short stories with two to four arithmetic steps and a whole-number answer, like GSM8K's, but
sharing none of its questions.

Problem i of a (split, seed) stream depends only on (split, seed, i), so a larger count extends a
smaller one. Every question names its protagonist, and the eval split draws protagonists from names
the train split never uses, so the two splits share no question. Each problem carries
its answer so that tests can check that every template makes a solvable problem.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

NAMES = (
    "Amara", "Ben", "Carla", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi", "Lena",
    "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wen", "Yusuf",
    "Zoe", "Aiden", "Bea", "Chidi", "Dana", "Emil", "Freya", "Gus", "Hana", "Ivan", "Joy", "Kai",
)
BAKED = ("muffins", "cookies", "bagels", "pretzels", "scones", "bread rolls", "cupcakes")
GOODS = (("notebook", "notebooks"), ("pen", "pens"), ("shirt", "shirts"), ("plant pot", "plant pots"),
         ("puzzle", "puzzles"), ("candle", "candles"), ("towel", "towels"), ("mug", "mugs"))
COLLECTIONS = ("stickers", "marbles", "stamps", "trading cards", "seashells", "beads", "coins")
CROPS = (("tomato plants", "tomatoes"), ("pepper plants", "peppers"), ("bean plants", "pods"),
         ("apple trees", "apples"), ("strawberry plants", "berries"))
WANTS = ("bicycle", "tablet", "guitar", "pair of skates", "telescope", "camera", "skateboard")


@dataclass(frozen=True)
class WordProblem:
    template: str
    question: str
    answer: int


def _shopping_change(r: random.Random, name: str) -> tuple[str, int]:
    (_, many), (_, many2) = r.sample(GOODS, 2)
    a, b, p, q = r.randint(2, 6), r.randint(2, 5), r.randint(2, 15), r.randint(3, 20)
    cost = a * p + b * q
    bill = next(v for v in (20, 50, 100, 200) if v > cost)
    return (f"{name} buys {a} {many} for ${p} each and {b} {many2} for ${q} each. {name} pays with a "
            f"${bill} bill. How much change does {name} get back?"), bill - cost


def _eggs_week(r: random.Random, name: str) -> tuple[str, int]:
    hens, per, used, price = r.randint(4, 12), r.randint(1, 2), r.randint(2, 5), r.randint(1, 3)
    eggs = hens * per
    used = min(used, eggs - 1)
    return (f"{name} keeps {hens} hens, and each hen lays {per} egg{'s' if per > 1 else ''} a day. "
            f"{name} uses {used} eggs every day for cooking and sells the rest for ${price} each. "
            f"How much money does {name} make from eggs in a week?"), (eggs - used) * price * 7


def _book_pages(r: random.Random, name: str) -> tuple[str, int]:
    weekday, weekend, weeks = r.randint(5, 25), r.randint(10, 40), r.randint(1, 3)
    read = weeks * (5 * weekday + 2 * weekend)
    pages = read + r.randint(10, 200)
    return (f"{name} is reading a book with {pages} pages. {name} reads {weekday} pages every weekday and "
            f"{weekend} pages on each day of the weekend. How many pages are left to read after "
            f"{weeks} week{'s' if weeks > 1 else ''}?"), pages - read


def _saving_weeks(r: random.Random, name: str) -> tuple[str, int]:
    want, weekly, weeks, start = r.choice(WANTS), r.randint(5, 30), r.randint(3, 20), r.randint(10, 120)
    price = start + weekly * weeks
    return (f"{name} wants to buy a {want} that costs ${price}. {name} has already saved ${start} and puts "
            f"away ${weekly} every week. How many weeks will it take {name} to have exactly enough money?"), weeks


def _ages(r: random.Random, name: str) -> tuple[str, int]:
    other = r.choice([n for n in NAMES if n != name])
    young, gap, later = r.randint(3, 40), r.randint(2, 30), r.randint(2, 15)
    return (f"{name} is {gap} years older than {other}. In {later} years, {name} will be "
            f"{young + gap + later} years old. How old is {other} now?"), young


def _recipe(r: random.Random, name: str) -> tuple[str, int]:
    batch, flour, factor = r.choice((6, 8, 10, 12, 24)), r.randint(2, 5), r.randint(2, 6)
    many = r.choice(BAKED)
    return (f"A recipe for {batch} {many} uses {flour} cups of flour. {name} needs {batch * factor} {many} "
            f"for a school fair. How many cups of flour does {name} need?"), flour * factor


def _wages(r: random.Random, name: str) -> tuple[str, int]:
    rate, hours, days, weeks = r.randint(10, 30), r.randint(3, 8), r.randint(2, 6), r.randint(2, 4)
    return (f"{name} earns ${rate} an hour at a part-time job, working {hours} hours a day, {days} days a "
            f"week. How much does {name} earn in {weeks} weeks?"), rate * hours * days * weeks


def _two_legs(r: random.Random, name: str) -> tuple[str, int]:
    s1, t1, s2, t2 = r.randint(30, 70), r.randint(2, 5), r.randint(20, 60), r.randint(1, 4)
    return (f"{name} drives at {s1} miles per hour for {t1} hours, stops for lunch, and then drives at "
            f"{s2} miles per hour for {t2} more hours. How many miles does {name} drive in all?"), s1 * t1 + s2 * t2


def _give_away(r: random.Random, name: str) -> tuple[str, int]:
    thing = r.choice(COLLECTIONS)
    friends, each, bought = r.randint(2, 6), r.randint(3, 12), r.randint(5, 40)
    start = friends * each + r.randint(5, 60)
    return (f"{name} has {start} {thing}. {name} gives {each} {thing} to each of {friends} friends and then "
            f"buys {bought} more. How many {thing} does {name} have now?"), start - friends * each + bought


def _discount(r: random.Random, name: str) -> tuple[str, int]:
    one, many = r.choice(GOODS)
    off = r.choice((10, 20, 25, 50))
    price, count = r.randint(2, 12) * 20, r.randint(2, 5)
    return (f"A {one} normally costs ${price}. This week every {one} is {off}% off. {name} buys {count} "
            f"{many}. How much does {name} pay?"), count * price * (100 - off) // 100


def _class_travel(r: random.Random, name: str) -> tuple[str, int]:
    walk_div, bike_div, t = r.randint(2, 6), r.randint(2, 5), r.randint(1, 8)
    students = walk_div * bike_div * t  # whole numbers at every step: the walkers, then the bikers
    rest = students - students // walk_div
    return (f"{name}'s class has {students} students. One in {walk_div} of them walks to school. Of the "
            f"others, one in {bike_div} rides a bike and the rest take the bus. How many students take the "
            "bus?"), rest - rest // bike_div


def _garden(r: random.Random, name: str) -> tuple[str, int]:
    plants, crop = r.choice(CROPS)
    rows, per_row, dead, crop_each = r.randint(3, 9), r.randint(4, 12), r.randint(1, 6), r.randint(3, 15)
    return (f"{name} plants {rows} rows of {plants} with {per_row} in each row. {dead} of them do not "
            f"survive. Each of the others gives {crop_each} {crop}. How many {crop} does {name} "
            "harvest?"), (rows * per_row - dead) * crop_each


def _homework_hours(r: random.Random, name: str) -> tuple[str, int]:
    weeks = r.randint(2, 6)
    while True:
        weekday, saturday = r.choice((20, 30, 40, 45, 50, 60)), r.choice((30, 60, 90, 120))
        if (weekday * 5 + saturday) * weeks % 60 == 0:
            break
    hours = (weekday * 5 + saturday) * weeks // 60
    return (f"{name} spends {weekday} minutes on homework every weekday and {saturday} minutes on "
            f"Saturday. How many hours of homework does {name} do in {weeks} weeks?"), hours


def _tickets(r: random.Random, name: str) -> tuple[str, int]:
    adult, child, parking = r.randint(8, 25), r.randint(4, 12), r.randint(5, 15)
    adults, kids = r.randint(1, 3), r.randint(1, 5)
    return (f"Tickets to the zoo cost ${adult} for an adult and ${child} for a child. {name} goes with "
            f"{adults} adult{'s' if adults > 1 else ''} (counting {name}) and {kids} "
            f"child{'ren' if kids > 1 else ''}, and parking costs ${parking}. How much does the trip cost "
            "in total?"), adult * adults + child * kids + parking


def _boxes(r: random.Random, name: str) -> tuple[str, int]:
    per_box, days = r.choice((4, 6, 8, 10, 12, 20)), r.randint(3, 10)
    made = per_box * r.randint(10, 60)
    return (f"{name}'s workshop makes {made} toys a day and packs them in boxes of {per_box}. How many "
            f"boxes does it fill in {days} days?"), made // per_box * days


def _marbles(r: random.Random, name: str) -> tuple[str, int]:
    b, c = r.sample([n for n in NAMES if n != name], 2)
    thing = r.choice(COLLECTIONS)
    x, times = r.randint(4, 30), r.randint(2, 5)
    fewer = r.randint(1, x * times - 1)
    return (f"{name} has {x} {thing}. {b} has {times} times as many as {name}, and {c} has {fewer} fewer "
            f"than {b}. How many {thing} do the three of them have together?"), x + x * times + x * times - fewer


def _fuel(r: random.Random, name: str) -> tuple[str, int]:
    miles_per, price, trips = r.choice((20, 25, 30, 40)), r.randint(3, 6), r.randint(2, 12)
    distance = miles_per * trips
    return (f"{name}'s car goes {miles_per} miles on one gallon of gas, and gas costs ${price} a gallon. How "
            f"much does the gas cost for a {distance}-mile trip?"), trips * price


def _pizza(r: random.Random, name: str) -> tuple[str, int]:
    pizzas, slices, people, each = r.randint(2, 6), r.choice((6, 8, 10, 12)), r.randint(3, 9), r.randint(1, 3)
    while people * each >= pizzas * slices:
        people -= 1
    return (f"{name} orders {pizzas} pizzas for a party, each cut into {slices} slices. {people} people "
            f"eat {each} slice{'s' if each > 1 else ''} each. How many slices are left over?"), \
        pizzas * slices - people * each


def _budget(r: random.Random, name: str) -> tuple[str, int]:
    rent, food_pct = r.randint(4, 12) * 100, r.choice((10, 20, 25, 50))
    rest = r.randint(4, 20) * 100
    return (f"{name} earns ${rent + rest} a month and pays ${rent} for rent. {name} spends {food_pct}% of "
            f"what is left on food. How much money does {name} have after rent and food?"), \
        rest * (100 - food_pct) // 100


def _tank(r: random.Random, name: str) -> tuple[str, int]:
    frac, rate, t = r.choice((2, 3, 4, 5)), r.randint(2, 15), r.randint(2, 10)
    capacity = rate * t * frac  # 1/frac full: the missing (frac - 1)/frac takes rate * minutes
    return (f"A water tank holds {capacity} liters and is 1/{frac} full. {name} fills it with a hose that "
            f"adds {rate} liters a minute. How many minutes does it take to fill the tank?"), t * (frac - 1)


def _bake_sale(r: random.Random, name: str) -> tuple[str, int]:
    many = r.choice(BAKED)
    trays, per_tray, price, left = r.randint(2, 6), r.randint(6, 24), r.randint(1, 4), r.randint(0, 10)
    left = min(left, trays * per_tray - 1)
    return (f"{name} bakes {trays} trays of {many} with {per_tray} on each tray and sells them for ${price} "
            f"each. At the end of the day {left} are left. How much money did {name} make?"), \
        (trays * per_tray - left) * price


TEMPLATES: dict[str, Callable[[random.Random, str], tuple[str, int]]] = {
    f.__name__.lstrip("_"): f
    for f in (_shopping_change, _eggs_week, _book_pages, _saving_weeks, _ages, _recipe, _wages, _two_legs,
              _give_away, _discount, _class_travel, _garden, _homework_hours, _tickets, _boxes, _marbles,
              _fuel, _pizza, _budget, _tank, _bake_sale)
}


def word_problem(split: str, seed: int, index: int) -> WordProblem:
    """Problem `index` of the (split, seed) stream; template `index % len(TEMPLATES)`."""
    names = list(TEMPLATES)
    template = names[index % len(names)]
    rng = random.Random(f"word_problems/{split}/{seed}/{index}")
    # every 4th name is kept for the eval split
    names_of_split = NAMES[::4] if split == "eval" else [n for i, n in enumerate(NAMES) if i % 4]
    question, answer = TEMPLATES[template](rng, rng.choice(names_of_split))
    return WordProblem(template, question, answer)
