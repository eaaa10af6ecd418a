#!/bin/bash
sort -n input.txt | tail -n 1 > final.txt
