"""A goal judged with its interval: "met" only when the interval's worse end meets it."""

from __future__ import annotations

from ..errors import DataError


def goal_met(estimate: float, ci_low: float, ci_high: float, goal: float, *, higher_is_better: bool = True) -> dict:
    """Is a goal met by an estimate with its interval? Only when the interval's worse end meets it.

    Returns {"verdict": "met" | "point estimate only" | "not met", "line": a sentence naming the numbers,
    "worse_end": the interval's end that must meet the goal}. "point estimate only": the estimate meets
    the goal but the interval reaches below it, so the data do not show the goal is met.
    """
    if not ci_low <= estimate <= ci_high:
        raise DataError(f"estimate={estimate} lies outside its interval [{ci_low}, {ci_high}]")
    worse = ci_low if higher_is_better else ci_high
    meets = (lambda x: x >= goal) if higher_is_better else (lambda x: x <= goal)
    if meets(worse):
        verdict = "met"
        line = f"goal {goal:g} met: the interval's worse end {worse:g} meets it (estimate {estimate:g})"
    elif meets(estimate):
        verdict = "point estimate only"
        line = (f"goal {goal:g}: point estimate only ({estimate:g} meets it, the interval reaches {worse:g}, "
                "which does not)")
    else:
        verdict = "not met"
        line = f"goal {goal:g} not met (estimate {estimate:g}, interval [{ci_low:g}, {ci_high:g}])"
    return {"verdict": verdict, "line": line, "worse_end": worse}
