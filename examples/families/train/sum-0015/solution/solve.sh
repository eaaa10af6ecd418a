#!/bin/bash
paste -sd+ notes.txt | bc > report.txt
