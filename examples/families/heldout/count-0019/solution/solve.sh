#!/bin/bash
wc -l < values.txt > result.txt
