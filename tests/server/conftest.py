"""Shared fixtures: the server's address, model id and process id (set by run.sh)."""

import os

import openai
import pytest


@pytest.fixture(scope="session")
def base_url() -> str:
    return os.environ["STRATA_URL"]


@pytest.fixture(scope="session")
def model() -> str:
    return os.environ.get("STRATA_MODEL", "strata-tiny-moe")


@pytest.fixture(scope="session")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60)
