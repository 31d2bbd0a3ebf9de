"""The source material of the bundled toy dataset: small Python modules, each with one function
per bug kind, and the inputs their tests call them with.

Each :class:`Family` is a correct module. Each of its functions carries one *site*: an
``old → new`` text change that plants a bug of one kind in that function. A toy task takes one
family, plants the bug of one kind, and offers the fix plus decoys (the sites of other kinds,
which plant a second bug elsewhere) as named candidate edits. Expected values in the tests are
computed by running the correct module at generation time (:mod:`agentrl.rollout.tasks.toy`),
so every expectation is real.

Callers: :mod:`agentrl.rollout.tasks.toy` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The shared bug kinds; candidate edits are named after them (the toy agent's ``apply NAME``).
BUG_KINDS = (
    "off_by_one",
    "swap_comparison",
    "wrong_operator",
    "negate_condition",
    "wrong_constant",
    "missing_return",
)


@dataclass(frozen=True)
class Site:
    """Where a bug of ``kind`` is planted in ``function``: ``old`` (correct) becomes ``new``."""

    kind: str
    function: str
    old: str
    new: str
    cases: tuple[tuple[Any, ...], ...]
    """Argument tuples the tests call ``function`` with."""


@dataclass(frozen=True)
class Family:
    """One correct module and the bug sites in it."""

    module: str
    source: str
    sites: tuple[Site, ...]


STATS = Family(
    module="stats",
    source='''"""Small statistics helpers."""


def window_sums(values, width):
    """Sums of every run of `width` consecutive values, left to right."""
    sums = []
    for start in range(len(values) - width + 1):
        sums.append(sum(values[start:start + width]))
    return sums


def count_above(values, threshold):
    """How many values are strictly greater than `threshold`."""
    count = 0
    for value in values:
        if value > threshold:
            count += 1
    return count


def weighted_total(prices, quantities):
    """Sum of price times quantity over matching pairs."""
    total = 0
    for price, qty in zip(prices, quantities):
        total += price * qty
    return total


def evens_only(values):
    """The even values, in order."""
    return [v for v in values if v % 2 == 0]


def percent(part, whole):
    """`part` as a percentage of `whole`, rounded to 2 decimals."""
    return round(part * 100 / whole, 2)


def spread(values):
    """Largest value minus smallest value."""
    lowest = min(values)
    highest = max(values)
    return highest - lowest
''',
    sites=(
        Site(
            "off_by_one",
            "window_sums",
            "len(values) - width + 1)",
            "len(values) - width)",
            (([1, 2, 3, 4], 2), ([5, 5, 5], 3), ([1, 2, 3], 1)),
        ),
        Site(
            "swap_comparison",
            "count_above",
            "if value > threshold:",
            "if value < threshold:",
            (([1, 5, 9], 4), ([10, 20, 30], 25), ([3, 3, 3], 1)),
        ),
        Site(
            "wrong_operator",
            "weighted_total",
            "total += price * qty",
            "total += price + qty",
            (([2, 3], [4, 5]), ([10], [3]), ([1, 1, 1], [7, 8, 9])),
        ),
        Site(
            "negate_condition",
            "evens_only",
            "if v % 2 == 0]",
            "if v % 2 != 0]",
            (([1, 2, 3, 4],), ([6, 7, 8],), ([2, 4, 5],)),
        ),
        Site(
            "wrong_constant",
            "percent",
            "part * 100 / whole",
            "part * 10 / whole",
            ((1, 4), (3, 8), (50, 200)),
        ),
        Site(
            "missing_return",
            "spread",
            "    return highest - lowest\n",
            "    highest - lowest\n",
            (([3, 9, 4],), ([10, 2],), ([7],)),
        ),
    ),
)

STRINGS = Family(
    module="textutil",
    source='''"""Text helpers."""


def last_n_chars(text, n):
    """The last `n` characters of `text` (all of it when shorter)."""
    if n >= len(text):
        return text
    return text[len(text) - n:]


def shorter_than(words, limit):
    """Words with fewer than `limit` characters."""
    return [w for w in words if len(w) < limit]


def repeat_word(word, times):
    """`word` repeated `times` times, separated by dashes."""
    return "-".join([word] * times)


def is_palindrome(text):
    """True when `text` reads the same backwards, ignoring case."""
    folded = text.lower()
    if folded == folded[::-1]:
        return True
    return False


def pad_left(text, width):
    """`text` right-aligned in `width` characters with dots."""
    return "." * max(0, width - len(text)) + text


def initials(name):
    """Upper-case first letters of each word of `name`."""
    letters = [part[0].upper() for part in name.split()]
    return "".join(letters)
''',
    sites=(
        Site(
            "off_by_one",
            "last_n_chars",
            "text[len(text) - n:]",
            "text[len(text) - n + 1:]",
            (("python", 3), ("abcdef", 1), ("hello", 4)),
        ),
        Site(
            "swap_comparison",
            "shorter_than",
            "if len(w) < limit]",
            "if len(w) > limit]",
            ((["a", "abcd", "ab"], 3), (["tree", "go", "sky"], 4), (["x", "yy"], 2)),
        ),
        Site(
            "wrong_operator",
            "repeat_word",
            "[word] * times",
            "[word] + [times]",
            (("ha", 3), ("go", 2), ("x", 1)),
        ),
        Site(
            "negate_condition",
            "is_palindrome",
            "if folded == folded[::-1]:",
            "if folded != folded[::-1]:",
            (("Level",), ("python",), ("noon",)),
        ),
        Site(
            "wrong_constant",
            "pad_left",
            'return "." * max(0, width - len(text))',
            'return "." * max(1, width - len(text))',
            (("ab", 5), ("abc", 3), ("", 2)),
        ),
        Site(
            "missing_return",
            "initials",
            '    return "".join(letters)\n',
            '    "".join(letters)\n',
            (("ada lovelace",), ("grace brewster hopper",), ("x",)),
        ),
    ),
)

INVENTORY = Family(
    module="inventory",
    source='''"""Stock keeping."""

RESTOCK_LEVEL = 5


def last_items(items, count):
    """The final `count` items of the list."""
    return items[len(items) - count:]


def low_stock(stock):
    """Names whose quantity is at or below the restock level, sorted."""
    return sorted(name for name, qty in stock.items() if qty <= RESTOCK_LEVEL)


def remaining(stock, name, sold):
    """Quantity of `name` left after selling `sold`."""
    return stock[name] - sold


def in_stock(stock, name):
    """True when `name` has at least one unit."""
    if stock.get(name, 0) > 0:
        return True
    return False


def boxes_needed(units):
    """Boxes of 12 needed to pack `units`."""
    return (units + 11) // 12


def total_units(stock):
    """All units in stock."""
    units = sum(stock.values())
    return units
''',
    sites=(
        Site(
            "off_by_one",
            "last_items",
            "items[len(items) - count:]",
            "items[len(items) - count + 1:]",
            ((["a", "b", "c", "d"], 2), ([1, 2, 3], 3), (["x", "y"], 1)),
        ),
        Site(
            "swap_comparison",
            "low_stock",
            "if qty <= RESTOCK_LEVEL)",
            "if qty >= RESTOCK_LEVEL)",
            (({"bolt": 2, "nut": 40, "gear": 5},), ({"pin": 9, "cog": 1},)),
        ),
        Site(
            "wrong_operator",
            "remaining",
            "return stock[name] - sold",
            "return stock[name] + sold",
            (({"bolt": 10}, "bolt", 3), ({"nut": 7}, "nut", 7)),
        ),
        Site(
            "negate_condition",
            "in_stock",
            "if stock.get(name, 0) > 0:",
            "if not stock.get(name, 0) > 0:",
            (({"bolt": 2}, "bolt"), ({"bolt": 0}, "bolt"), ({}, "gear")),
        ),
        Site(
            "wrong_constant",
            "boxes_needed",
            "(units + 11) // 12",
            "(units + 11) // 10",
            ((1,), (24,), (25,), (0,)),
        ),
        Site(
            "missing_return",
            "total_units",
            "    return units\n",
            "    units\n",
            (({"a": 1, "b": 2},), ({"x": 10},), ({},)),
        ),
    ),
)

GEOMETRY = Family(
    module="geometry",
    source='''"""Integer geometry on a grid."""


def grid_points(width):
    """Coordinates 0..width inclusive along one axis."""
    return list(range(width + 1))


def inside_box(x, y, size):
    """True when (x, y) lies inside the square [0, size) x [0, size)."""
    return 0 <= x < size and 0 <= y < size


def rect_area(width, height):
    """Area of a width x height rectangle."""
    return width * height


def on_diagonal(x, y):
    """True when the point lies on the line y = x."""
    if x == y:
        return True
    return False


def perimeter(width, height):
    """Perimeter of a width x height rectangle."""
    return 2 * (width + height)


def manhattan(a, b):
    """Manhattan distance between points a and b."""
    distance = abs(a[0] - b[0]) + abs(a[1] - b[1])
    return distance
''',
    sites=(
        Site("off_by_one", "grid_points", "range(width + 1)", "range(width)", ((3,), (0,), (5,))),
        Site(
            "swap_comparison",
            "inside_box",
            "0 <= x < size and",
            "0 <= x > size and",
            ((1, 1, 4), (5, 1, 4), (0, 3, 4)),
        ),
        Site(
            "wrong_operator",
            "rect_area",
            "return width * height",
            "return width + height",
            ((3, 4), (5, 5), (1, 7)),
        ),
        Site(
            "negate_condition", "on_diagonal", "if x == y:", "if x != y:", ((2, 2), (1, 3), (0, 0))
        ),
        Site(
            "wrong_constant",
            "perimeter",
            "return 2 * (width + height)",
            "return 4 * (width + height)",
            ((3, 4), (1, 1), (10, 2)),
        ),
        Site(
            "missing_return",
            "manhattan",
            "    return distance\n",
            "    distance\n",
            (((0, 0), (3, 4)), ((1, 1), (1, 1)), ((2, 5), (7, 1))),
        ),
    ),
)

CALENDAR = Family(
    module="calendar_tools",
    source='''"""Day arithmetic."""

DAYS_PER_WEEK = 7


def days_in_range(first, last):
    """Day numbers from `first` to `last` inclusive."""
    return list(range(first, last + 1))


def is_before(day_a, day_b):
    """True when `day_a` comes strictly before `day_b`."""
    return day_a < day_b


def days_between(start, end):
    """Number of days from `start` to `end`."""
    return end - start


def is_weekend(day):
    """Days 5 and 6 of each week are the weekend."""
    if day % DAYS_PER_WEEK >= 5:
        return True
    return False


def weekday(day):
    """Position of `day` within its week (0-6)."""
    return day % 7


def weeks_spanned(days):
    """Whole weeks in `days` days."""
    weeks = days // DAYS_PER_WEEK
    return weeks
''',
    sites=(
        Site(
            "off_by_one",
            "days_in_range",
            "list(range(first, last + 1))",
            "list(range(first, last))",
            ((1, 3), (5, 5), (0, 6)),
        ),
        Site(
            "swap_comparison",
            "is_before",
            "return day_a < day_b",
            "return day_a > day_b",
            ((1, 2), (9, 3), (4, 4)),
        ),
        Site(
            "wrong_operator",
            "days_between",
            "return end - start",
            "return end + start",
            ((3, 10), (0, 7), (5, 5)),
        ),
        Site(
            "negate_condition",
            "is_weekend",
            "if day % DAYS_PER_WEEK >= 5:",
            "if not day % DAYS_PER_WEEK >= 5:",
            ((5,), (2,), (13,)),
        ),
        Site("wrong_constant", "weekday", "return day % 7", "return day % 6", ((6,), (13,), (20,))),
        Site(
            "missing_return",
            "weeks_spanned",
            "    return weeks\n",
            "    weeks\n",
            ((14,), (20,), (3,)),
        ),
    ),
)

BANK = Family(
    module="bank",
    source='''"""A toy bank ledger."""

FEE = 2


def recent(transactions, count):
    """The most recent `count` transactions (the list is oldest first)."""
    return transactions[-count:] if count > 0 else []


def can_withdraw(balance, amount):
    """True when `amount` does not exceed `balance`."""
    return amount <= balance


def apply_interest(balance, rate_percent):
    """Balance after one period of simple interest, in whole units."""
    return balance + balance * rate_percent // 100


def overdrawn(balances):
    """Accounts with a negative balance, sorted."""
    return sorted(name for name, value in balances.items() if value < 0)


def after_fee(balance):
    """Balance after the fixed monthly fee."""
    return balance - FEE


def net_flow(transactions):
    """Sum of all transactions."""
    flow = sum(transactions)
    return flow
''',
    sites=(
        Site(
            "off_by_one",
            "recent",
            "transactions[-count:]",
            "transactions[-count + 1:]",
            (([1, 2, 3, 4], 2), ([5, 6], 1), ([9, 8, 7], 3)),
        ),
        Site(
            "swap_comparison",
            "can_withdraw",
            "return amount <= balance",
            "return amount >= balance",
            ((100, 30), (10, 50), (20, 20)),
        ),
        Site(
            "wrong_operator",
            "apply_interest",
            "balance * rate_percent // 100",
            "balance + rate_percent // 100",
            ((1000, 5), (200, 10), (50, 0)),
        ),
        Site(
            "negate_condition",
            "overdrawn",
            "if value < 0)",
            "if not value < 0)",
            (({"ann": -5, "bob": 10},), ({"cy": 0, "di": -1, "ed": -3},)),
        ),
        Site(
            "wrong_constant",
            "after_fee",
            "return balance - FEE",
            "return balance - 3",
            ((10,), (2,), (100,)),
        ),
        Site(
            "missing_return",
            "net_flow",
            "    return flow\n",
            "    flow\n",
            (([10, -3, 5],), ([],), ([-1, -1],)),
        ),
    ),
)

GRADES = Family(
    module="grades",
    source='''"""Course grading."""

PASS_MARK = 50


def top_scores(scores, count):
    """The `count` highest scores, highest first."""
    ordered = sorted(scores, reverse=True)
    return ordered[:count]


def passed(scores):
    """Students at or above the pass mark, sorted."""
    return sorted(name for name, mark in scores.items() if mark >= PASS_MARK)


def average(marks):
    """Mean mark rounded down."""
    return sum(marks) // len(marks)


def needs_retake(mark):
    """True when the mark is below the pass mark."""
    if mark < PASS_MARK:
        return True
    return False


def letter(mark):
    """A for 90+, B for 75+, C otherwise."""
    if mark >= 90:
        return "A"
    if mark >= 75:
        return "B"
    return "C"


def curve(marks, bonus):
    """Every mark raised by `bonus`, capped at 100."""
    curved = [min(100, m + bonus) for m in marks]
    return curved
''',
    sites=(
        Site(
            "off_by_one",
            "top_scores",
            "return ordered[:count]",
            "return ordered[:count - 1]",
            (([70, 90, 80], 2), ([5, 1, 3, 4], 3), ([50], 1)),
        ),
        Site(
            "swap_comparison",
            "passed",
            "if mark >= PASS_MARK)",
            "if mark <= PASS_MARK)",
            (({"ann": 75, "bob": 30, "cy": 50},), ({"di": 99, "ed": 10},)),
        ),
        Site(
            "wrong_operator",
            "average",
            "return sum(marks) // len(marks)",
            "return sum(marks) - len(marks)",
            (([80, 90, 70],), ([50, 51],), ([10],)),
        ),
        Site(
            "negate_condition",
            "needs_retake",
            "if mark < PASS_MARK:",
            "if not mark < PASS_MARK:",
            ((30,), (50,), (80,)),
        ),
        Site(
            "wrong_constant",
            "letter",
            "if mark >= 75:",
            "if mark >= 70:",
            ((95,), (72,), (80,), (40,)),
        ),
        Site(
            "missing_return",
            "curve",
            "    return curved\n",
            "    curved\n",
            (([90, 98], 5), ([10], 0), ([], 3)),
        ),
    ),
)

QUEUE = Family(
    module="taskqueue",
    source='''"""A priority queue of jobs given as (priority, name) pairs."""

MAX_RETRIES = 3


def batch(jobs, size):
    """The jobs split into batches of `size` (the last may be shorter)."""
    return [jobs[i:i + size] for i in range(0, len(jobs), size)]


def urgent(jobs, level):
    """Names of jobs with priority strictly above `level`."""
    return [name for priority, name in jobs if priority > level]


def total_priority(jobs):
    """Sum of all priorities."""
    return sum(priority for priority, _ in jobs)


def has_job(jobs, name):
    """True when a job called `name` is queued."""
    if any(job_name == name for _, job_name in jobs):
        return True
    return False


def should_retry(attempts):
    """True while fewer than MAX_RETRIES attempts were made."""
    return attempts < 3


def next_job(jobs):
    """Name of the job with the highest priority."""
    best = max(jobs)
    return best[1]
''',
    sites=(
        Site(
            "off_by_one",
            "batch",
            "jobs[i:i + size]",
            "jobs[i:i + size - 1]",
            (([1, 2, 3, 4, 5], 2), (["a", "b", "c"], 3), ([1, 2], 1)),
        ),
        Site(
            "swap_comparison",
            "urgent",
            "if priority > level]",
            "if priority < level]",
            (([(1, "a"), (5, "b"), (3, "c")], 2), ([(9, "x")], 9)),
        ),
        Site(
            "wrong_operator",
            "total_priority",
            "return sum(priority for priority, _ in jobs)",
            "return max(priority for priority, _ in jobs)",
            (([(1, "a"), (5, "b")],), ([(3, "c"), (3, "d"), (4, "e")],)),
        ),
        Site(
            "negate_condition",
            "has_job",
            "if any(job_name == name",
            "if not any(job_name == name",
            (([(1, "a"), (2, "b")], "b"), ([(1, "a")], "z")),
        ),
        Site(
            "wrong_constant",
            "should_retry",
            "return attempts < 3",
            "return attempts < 2",
            ((0,), (2,), (3,)),
        ),
        Site(
            "missing_return",
            "next_job",
            "    return best[1]\n",
            "    best[1]\n",
            (([(1, "a"), (5, "b")],), ([(2, "x")],)),
        ),
    ),
)

MATRIX = Family(
    module="matrix",
    source='''"""Lists of lists as matrices."""


def diagonal(matrix):
    """The main diagonal."""
    return [matrix[i][i] for i in range(len(matrix))]


def row_max_over(matrix, limit):
    """Indices of rows whose maximum exceeds `limit`."""
    return [i for i, row in enumerate(matrix) if max(row) > limit]


def scale(matrix, factor):
    """Every element multiplied by `factor`."""
    return [[value * factor for value in row] for row in matrix]


def is_square(matrix):
    """True when there are as many rows as columns."""
    if all(len(row) == len(matrix) for row in matrix):
        return True
    return False


def identity(size):
    """The size x size identity matrix."""
    return [[1 if r == c else 0 for c in range(size)] for r in range(size)]


def trace(matrix):
    """Sum of the main diagonal."""
    result = sum(matrix[i][i] for i in range(len(matrix)))
    return result
''',
    sites=(
        Site(
            "off_by_one",
            "diagonal",
            "for i in range(len(matrix))]",
            "for i in range(len(matrix) - 1)]",
            (([[1, 2], [3, 4]],), ([[5]],), ([[1, 0, 0], [0, 2, 0], [0, 0, 3]],)),
        ),
        Site(
            "swap_comparison",
            "row_max_over",
            "if max(row) > limit]",
            "if max(row) < limit]",
            (([[1, 9], [2, 3]], 5), ([[4], [6], [8]], 5)),
        ),
        Site(
            "wrong_operator",
            "scale",
            "value * factor",
            "value + factor",
            (([[1, 2], [3, 4]], 3), ([[0]], 5), ([[2]], 2)),
        ),
        Site(
            "negate_condition",
            "is_square",
            "if all(len(row) == len(matrix)",
            "if not all(len(row) == len(matrix)",
            (([[1, 2], [3, 4]],), ([[1, 2, 3]],), ([[7]],)),
        ),
        Site(
            "wrong_constant",
            "identity",
            "[[1 if r == c else 0",
            "[[2 if r == c else 0",
            ((2,), (1,), (3,)),
        ),
        Site(
            "missing_return",
            "trace",
            "    return result\n",
            "    result\n",
            (([[1, 2], [3, 4]],), ([[9]],)),
        ),
    ),
)

FAMILIES: tuple[Family, ...] = (
    STATS,
    STRINGS,
    INVENTORY,
    GEOMETRY,
    CALENDAR,
    BANK,
    GRADES,
    QUEUE,
    MATRIX,
)
