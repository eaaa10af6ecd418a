#!/bin/bash
sort -n nums.txt | tail -n 1 > max.txt
