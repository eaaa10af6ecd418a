#!/bin/bash
wc -l < input.txt > output.txt
