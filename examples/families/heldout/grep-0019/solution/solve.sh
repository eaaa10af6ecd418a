#!/bin/bash
grep warn records.txt > answer.txt
