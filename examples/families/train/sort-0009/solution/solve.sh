#!/bin/bash
sort values.txt > answer.txt
