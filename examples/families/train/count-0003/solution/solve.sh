#!/bin/bash
wc -l < values.txt > output.txt
