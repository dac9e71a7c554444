"""Imports and constants every part of the stand-in shares."""

from __future__ import annotations

import base64
import contextlib
import collections
import copy
import datetime as _dt
import ipaddress
import itertools
import json
import re
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx
import jsonpatch
import yaml

from hamid.logs import get_logger

log = get_logger("tests.k8s.apiserver")

SERVER_VERSION = {
    "major": "1",
    "minor": "30",
    "gitVersion": "v1.30.0-hamid-standin",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-04-17T00:00:00Z",
    "goVersion": "go1.22.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}

# ---------------------------------------------------------------------------
