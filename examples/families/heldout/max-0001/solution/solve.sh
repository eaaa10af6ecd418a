#!/bin/bash
sort -n lines.txt | tail -n 1 > answer.txt
