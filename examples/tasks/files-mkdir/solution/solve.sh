#!/bin/bash
mkdir -p build/logs
