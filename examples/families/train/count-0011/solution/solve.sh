#!/bin/bash
wc -l < data.txt > result.txt
