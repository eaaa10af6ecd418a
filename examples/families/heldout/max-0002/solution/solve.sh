#!/bin/bash
sort -n values.txt | tail -n 1 > result.txt
