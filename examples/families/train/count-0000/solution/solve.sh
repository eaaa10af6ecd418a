#!/bin/bash
wc -l < notes.txt > answer.txt
