"""A misspelt setting is never silently ignored: it is an error or a warning that names the
closest valid name, whichever way it was given (argument, ``config=``, environment)."""

from __future__ import annotations

import json

import pytest

import cirron as ci
from cirron import profiler
from support import run_python


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (
            {"snapshot": "stats"},
            "unexpected keyword argument 'snapshot'; did you mean 'snapshots'?",
        ),
        ({"flush_intervall": 2}, "did you mean 'flush_interval'?"),
        ({"outputs": "stdout"}, "did you mean 'output'?"),
        ({"buffer_size": 1024}, "it is a setting, pass it as config={'buffer_size': ...}"),
    ],
)
def test_an_unknown_argument_to_profile_names_the_closest_one(arguments, says):
    with pytest.raises(TypeError) as raised:
        ci.profile(**arguments)
    assert says in str(raised.value)
    assert profiler.current() is None  # the call started nothing


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"snapshots": "stat"}, "snapshots must be one of stats, sampled, full; got 'stat'; "
                                "did you mean 'stats'?"),
        ({"output": "stdot"}, "valid values are: spool, log, stdout, none; did you mean 'stdout'?"),
        ({"config": {"snapshots": "ful"}}, "config['snapshots'] must be one of"),
    ],
)  # fmt: skip
def test_an_invalid_value_names_the_setting_and_the_allowed_values(arguments, says):
    with pytest.raises(ValueError) as raised:
        ci.profile(**arguments)
    assert says in str(raised.value)


def warnings_of(code: str, **environment: str) -> list[str]:
    result = run_python(
        f"""
        import json, logging
        records = []
        logging.getLogger("cirron").addHandler(logging.Handler())
        logging.getLogger("cirron").handlers[-1].emit = lambda r: records.append(r.getMessage())
        import cirron as ci
        {code}
        ci.shutdown()
        print(json.dumps(records))
        """,
        env={"CIRRON_OUTPUT": "none", **environment},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_misspelt_setting_in_config_warns_once_and_stays_the_programs_own_flag():
    said = warnings_of(
        "handle = ci.profile(config={'flush_intervall': 2, 'learning_rate': 0.1})\n"
        "        ci.profile()\n"
        "        assert handle.config['flush_intervall'] == 2"
    )
    (warning,) = [line for line in said if "flush_intervall" in line]
    assert "not a setting of cirron" in warning and "did you mean 'flush_interval'?" in warning
    assert not [line for line in said if "learning_rate" in line]  # a flag of the program's own


def test_an_unknown_cirron_variable_warns_once_with_the_closest_name():
    said = warnings_of("ci.profile()", CIRRON_SNAPSHOT="full", CIRRON_FLUSH_INTERVALL="2")
    assert any(
        "CIRRON_SNAPSHOT is not a variable cirron reads" in line
        and "did you mean 'CIRRON_SNAPSHOTS'?" in line
        for line in said
    ), said
    assert sum("CIRRON_FLUSH_INTERVALL" in line for line in said) == 1, said


def test_an_invalid_variable_value_names_the_variable_and_the_allowed_values():
    said = warnings_of("ci.profile()", CIRRON_SNAPSHOTS="stat")
    assert any(
        "CIRRON_SNAPSHOTS='stat'" in line
        and "one of stats, sampled, full" in line
        and "did you mean 'stats'?" in line
        for line in said
    ), said
