#!/bin/bash
wc -l < values.txt > answer.txt
