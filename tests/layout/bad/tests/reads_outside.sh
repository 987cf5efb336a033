#!/usr/bin/env bash
# A test that reads data a clone does not have (the checker must find it).
ref=../shared/reference/decode
