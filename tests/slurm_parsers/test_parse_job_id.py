"""`sbatch --parsable` output: a job id (optionally `;cluster`), or an error naming what it printed."""

import pytest

from hpcserve.errors import HpcserveError
from hpcserve.slurm.client import parse_job_id


@pytest.mark.parametrize("out,jid", [("123\n", "123"), ("123;cluster-a\n", "123"),
                                     ("sbatch: warning: x\n4567\n", "4567")])
def test_job_id(out, jid):
    assert parse_job_id(out) == jid


@pytest.mark.parametrize("out", ["", "Submitted batch job 12\n", "12 13\n", "abc\n"])
def test_anything_else_is_an_error(out):
    with pytest.raises(HpcserveError, match="sbatch printed no job id"):
        parse_job_id(out)
