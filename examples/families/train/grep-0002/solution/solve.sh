#!/bin/bash
grep skip items.txt > output.txt
